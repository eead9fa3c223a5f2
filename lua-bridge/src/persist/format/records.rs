//! The records with fixed field lists that follow their tags (see the module docs' grammar).
//! Byte strings are `B`: a slice of the body when decoded, any bytes when encoded (the forger
//! keeps `Vec<u8>`).

use super::tag::Tag;
use super::wire::{Bad, Reader, Writer};
use crate::bridge::helpers::CiRecord;

/// The largest coroutine stack, and open-upvalue level, a file may declare (Lua's own limit,
/// `LUAI_MAXSTACK`, is checked when the values arrive).
pub const MAX_COROUTINE_STACK: u64 = 1_000_000;
/// The most call frames a suspended coroutine may declare (the C side refuses more too).
pub const MAX_COROUTINE_FRAMES: u64 = 100_000;
/// How deep a path into a chunk's prototype tree may go (Lua nests functions at most about 200
/// deep).
pub const MAX_PATH: u64 = 256;
/// Upvalue names a prototype record may list (Lua's MAXUPVAL).
pub const MAX_UPVALUE_NAMES: u64 = 255;

/// Before a new object's tag (format 7 on): `Tag::Ident`, then the identity the saving VM had
/// given the object as a table key (a varint in `1..IDENT_LIMIT`; luasnap's Lua, patch 4), so
/// the loaded object hashes where it did and tables keyed by it keep their layout and
/// `pairs()` order. Objects never used as keys have none, and nothing is written for them.
/// What may follow is [`Ident::PRECEDES`]; an identity is given once per file unless the
/// saving VM's counter started again (see `read/ident.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ident(pub u32);

/// Identities a file may give are below this: the saving VM's counter gives 1 up to this
/// minus 1, then starts again at 1 (luaH_keyid in ltable.c), and bit 31 marks the identities
/// permanents take from their names, which a file names instead of writing.
pub const IDENT_LIMIT: u64 = 1 << 31;

impl Ident {
    /// The tags of the objects an identity may precede: the new objects a load builds.
    pub const PRECEDES: [Tag; 8] = [
        Tag::Table,
        Tag::LClosure,
        Tag::CClosure,
        Tag::UdBytes,
        Tag::UdPlain,
        Tag::Thunk,
        Tag::TwoPhase,
        Tag::Thread,
    ];

    /// Writes `Tag::Ident` and the identity, or nothing for identity 0 (never a key).
    #[inline(always)]
    pub fn encode(&self, w: &mut Writer) {
        if self.0 != 0 {
            w.tagged(Tag::Ident, self.0 as u64);
        }
    }

    /// Reads the identity after `Tag::Ident` and checks that a new object's tag follows.
    pub fn decode(r: &mut Reader<'_>) -> Result<Self, Bad> {
        let ident = match r.varint() {
            Some(i) if (1..IDENT_LIMIT).contains(&i) => i as u32,
            _ => return Err("an identity out of range (1 to 2^31 - 1)"),
        };
        match r.peek().and_then(Tag::from_u8) {
            Some(t) if Self::PRECEDES.contains(&t) => Ok(Ident(ident)),
            _ => Err("an identity before a value that is not a new object"),
        }
    }
}

/// After the root of a whole-game save ([`PENDING_FORMAT`](super::PENDING_FORMAT) on), when
/// the saving VM had objects awaiting finalization that the root does not reach (dropped since
/// the last collection point, or separated for finalization and not yet finalized): their
/// count, then each as a value (a new table or userdata from bytes with its [`Final`] record,
/// or a reference to one written already). A body without bytes after the root has none.
/// The load builds them, marks them in their saved order and leaves them reachable from
/// nothing, so the collection point that would have finalized them in the saving process
/// finalizes them in the loading one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pending(pub u64);

impl Pending {
    /// Writes the count.
    pub fn encode(&self, w: &mut Writer) {
        w.varint(self.0);
    }

    /// Reads the count: at most one object per byte left (each value takes one at least).
    pub fn decode(r: &mut Reader<'_>) -> Result<Self, Bad> {
        match r.varint() {
            Some(n) if n > 0 && n <= r.remaining() as u64 => Ok(Pending(n)),
            Some(0) => Err("an empty list of objects awaiting finalization"),
            _ => Err("a count of objects awaiting finalization larger than the file"),
        }
    }
}

/// Before a new table or userdata rebuilt from bytes (format 8 on, ahead of its [`Ident`] if
/// it has one): `Tag::Final`, then whether the saving VM had marked the object for
/// finalization (a varint: 0 not marked, n + 1 marked n-th). Lua marks an object when
/// `setmetatable` gives it a metatable with `__gc`, once: an object finalized already (and
/// still reachable: resurrected) or whose metatable got its `__gc` later is not marked, and
/// one marked stays so when its metatable loses `__gc`. A save writes this record for each
/// object marked, and for each one not marked whose metatable has `__gc`; the loader marks
/// exactly the objects marked, in increasing n (the saving VM's order of marking, which
/// decides the order Lua runs finalizers in: the reverse), instead of those whose metatable
/// has `__gc`. The order numbers of one file are distinct.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Final(pub Option<u32>);

impl Final {
    /// The tags a finalization record may precede: an identity (whose object is checked
    /// when it registers) or a table or userdata from bytes.
    pub const PRECEDES: [Tag; 3] = [Tag::Ident, Tag::Table, Tag::UdBytes];

    /// Writes `Tag::Final` and the state.
    #[inline]
    pub fn encode(&self, w: &mut Writer) {
        w.tagged(Tag::Final, self.0.map_or(0, |n| n as u64 + 1));
    }

    /// Reads the state after `Tag::Final` and checks what follows.
    pub fn decode(r: &mut Reader<'_>) -> Result<Self, Bad> {
        let state = match r.varint() {
            Some(0) => None,
            Some(n) if n <= u32::MAX as u64 => Some((n - 1) as u32),
            _ => return Err("a finalization mark out of range"),
        };
        match r.peek().and_then(Tag::from_u8) {
            Some(t) if Self::PRECEDES.contains(&t) => Ok(Final(state)),
            _ => Err("a finalization mark before a value that is not a new table or userdata"),
        }
    }
}

/// After `Tag::Table`: the size hints of its array and hash parts. Its metatable and entries
/// follow ([`TablePart`](super::TablePart)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableHeader {
    pub narr: u64,
    pub nhash: u64,
}

impl TableHeader {
    /// Writes `Tag::Table` and the header.
    #[inline(always)]
    pub fn encode(&self, w: &mut Writer) {
        w.tagged(Tag::Table, self.narr);
        w.varint(self.nhash);
    }

    #[inline(always)]
    pub fn decode(r: &mut Reader<'_>) -> Result<Self, Bad> {
        match (r.varint(), r.varint()) {
            (Some(narr), Some(nhash)) => Ok(TableHeader { narr, nhash }),
            _ => Err("bad table header"),
        }
    }
}

/// After `Tag::UdBytes`: a userdata's bytes and its number of user values (at most Lua's
/// 65,535). Its metatable and user values follow ([`UserdataParts`](super::UserdataParts)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserdataBytes<B> {
    pub bytes: B,
    pub nuv: u64,
}

impl<B: AsRef<[u8]>> UserdataBytes<B> {
    /// Writes `Tag::UdBytes` and the record.
    pub fn encode(&self, w: &mut Writer) {
        w.tag(Tag::UdBytes);
        w.bytes(self.bytes.as_ref());
        w.varint(self.nuv);
    }
}

impl<'a> UserdataBytes<&'a [u8]> {
    pub fn decode(r: &mut Reader<'a>) -> Result<Self, Bad> {
        let (Some(bytes), Some(nuv)) = (r.bytes(), r.varint()) else {
            return Err("bad userdata");
        };
        if nuv > u16::MAX as u64 || nuv > r.remaining() as u64 {
            return Err("too many user values");
        }
        Ok(UserdataBytes { bytes, nuv })
    }
}

/// After `Tag::UdPlain`: a registered plain-data type's name and a value's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlainUserdata<B> {
    pub name: B,
    pub bytes: B,
}

impl<B: AsRef<[u8]>> PlainUserdata<B> {
    /// Writes `Tag::UdPlain` and the record.
    pub fn encode(&self, w: &mut Writer) {
        w.tag(Tag::UdPlain);
        w.bytes(self.name.as_ref());
        w.bytes(self.bytes.as_ref());
    }
}

impl<'a> PlainUserdata<&'a [u8]> {
    pub fn decode(r: &mut Reader<'a>) -> Result<Self, Bad> {
        match (r.bytes(), r.bytes()) {
            (Some(name), Some(bytes)) => Ok(PlainUserdata { name, bytes }),
            _ => Err("bad plain userdata"),
        }
    }
}

/// After `Tag::Thread`: the coroutine's state byte, then for a live one the size of its stack
/// (slots, its function's excluded) and for a suspended one its error handler's stack offset.
/// Its stack values follow, then for a suspended one its frames
/// ([`ThreadParts`](super::ThreadParts), [`CallFrame`], [`PendingCloses`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadHeader {
    /// Returned, failed, or created without a function.
    Dead,
    /// Created, not resumed yet: its function and arguments on the stack.
    NotStarted { stack: u64 },
    /// Yielded: its stack, call frames and pending to-be-closed variables.
    Suspended { stack: u64, errfunc: i64 },
}

impl ThreadHeader {
    /// The state byte of a coroutine not started.
    pub const NOT_STARTED: u8 = 0;
    /// The state byte of a dead coroutine.
    pub const DEAD: u8 = 1;
    /// The state byte of a suspended coroutine.
    pub const SUSPENDED: u8 = 2;

    /// Writes `Tag::Thread` and the header.
    pub fn encode(&self, w: &mut Writer) {
        w.tag(Tag::Thread);
        match *self {
            ThreadHeader::Dead => w.u8(Self::DEAD),
            ThreadHeader::NotStarted { stack } => {
                w.u8(Self::NOT_STARTED);
                w.varint(stack);
            }
            ThreadHeader::Suspended { stack, errfunc } => {
                w.u8(Self::SUSPENDED);
                w.varint(stack);
                w.i64(errfunc);
            }
        }
    }

    /// The state byte (the first part of decoding: a loader makes the coroutine before it
    /// reads the rest).
    pub fn state(r: &mut Reader<'_>) -> Result<u8, Bad> {
        r.u8().ok_or("bad thread")
    }

    /// The rest of the header, for the state byte `state`.
    pub fn decode(state: u8, r: &mut Reader<'_>) -> Result<Self, Bad> {
        if state == Self::DEAD {
            return Ok(ThreadHeader::Dead);
        }
        if state != Self::NOT_STARTED && state != Self::SUSPENDED {
            return Err("unknown coroutine state");
        }
        let stack = r.varint().ok_or("bad thread")?;
        if stack == 0 || stack > r.remaining() as u64 || stack > MAX_COROUTINE_STACK {
            return Err("bad coroutine stack size");
        }
        if state == Self::NOT_STARTED {
            return Ok(ThreadHeader::NotStarted { stack });
        }
        let errfunc = r.i64().ok_or("bad thread")?;
        Ok(ThreadHeader::Suspended { stack, errfunc })
    }

    /// The stack values that follow (none for a dead coroutine).
    pub fn stack(&self) -> u64 {
        match *self {
            ThreadHeader::Dead => 0,
            ThreadHeader::NotStarted { stack } | ThreadHeader::Suspended { stack, .. } => stack,
        }
    }
}

/// A call frame of a suspended coroutine (after its stack values: a count, then each frame
/// followed by its continuation, `Nil` or a permanent's name), as Lua's `CallInfo` has it in
/// stack-slot offsets: the fields of [`CiRecord`] but the continuation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallFrame {
    /// The stack slot of the frame's function.
    pub func: u64,
    /// The frame's stack top (a slot).
    pub top: u64,
    /// `CallInfo.callstatus` (see `forge::cist`).
    pub callstatus: u64,
    /// `CallInfo.u2` (a C frame's function index or results; a Lua frame's per-call field).
    pub u2: i64,
    /// A Lua frame's saved program counter (an instruction index).
    pub pc: u64,
    /// A vararg function's extra arguments.
    pub extra: u64,
    /// The error handler before a protected call (a stack offset).
    pub old_errfunc: i64,
    /// A C frame's continuation context.
    pub ctx: i64,
}

impl CallFrame {
    /// The frame `ci` describes (a negative count of extra arguments is written as 0).
    pub(crate) fn of(ci: &CiRecord) -> CallFrame {
        CallFrame {
            func: ci.func as u64,
            top: ci.top as u64,
            callstatus: ci.callstatus as u64,
            u2: ci.u2 as i64,
            pc: ci.pc as u64,
            extra: ci.nextraargs.max(0) as u64,
            old_errfunc: ci.old_errfunc,
            ctx: ci.ctx,
        }
    }

    /// This frame as the C side restores it, with the continuation `k` (a decoded frame's
    /// fields fit: see `decode`).
    pub(crate) fn to_ci(self, k: *const std::ffi::c_void) -> CiRecord {
        CiRecord {
            func: self.func as i32,
            top: self.top as i32,
            callstatus: self.callstatus as u32,
            u2: self.u2 as i32,
            pc: self.pc as i32,
            nextraargs: self.extra as i32,
            old_errfunc: self.old_errfunc,
            ctx: self.ctx,
            k,
        }
    }

    /// Writes the frame count.
    pub fn encode_count(w: &mut Writer, n: u64) {
        w.varint(n);
    }

    /// The frame count: at least one, at most [`MAX_COROUTINE_FRAMES`], and no more than the
    /// bytes left.
    pub fn count(r: &mut Reader<'_>) -> Result<u64, Bad> {
        let nci = r.varint().ok_or("bad coroutine frames")?;
        if nci == 0 || nci > MAX_COROUTINE_FRAMES || nci > r.remaining() as u64 {
            return Err("bad coroutine frame count");
        }
        Ok(nci)
    }

    /// Writes the frame (its continuation is the caller's to write).
    pub fn encode(&self, w: &mut Writer) {
        w.varint(self.func);
        w.varint(self.top);
        w.varint(self.callstatus);
        w.i64(self.u2);
        w.varint(self.pc);
        w.varint(self.extra);
        w.i64(self.old_errfunc);
        w.i64(self.ctx);
    }

    /// A frame whose fields fit a `CiRecord`.
    pub fn decode(r: &mut Reader<'_>) -> Result<Self, Bad> {
        let fields = (
            r.varint(),
            r.varint(),
            r.varint(),
            r.i64(),
            r.varint(),
            r.varint(),
            r.i64(),
            r.i64(),
        );
        let (
            Some(func),
            Some(top),
            Some(callstatus),
            Some(u2),
            Some(pc),
            Some(extra),
            Some(old_errfunc),
            Some(ctx),
        ) = fields
        else {
            return Err("bad coroutine frame");
        };
        let fits = |v: u64| v <= i32::MAX as u64;
        if !fits(func)
            || !fits(top)
            || callstatus > u32::MAX as u64
            || !fits(pc)
            || !fits(extra)
            || u2 < i32::MIN as i64
            || u2 > i32::MAX as i64
        {
            return Err("coroutine frame field out of range");
        }
        Ok(CallFrame {
            func,
            top,
            callstatus,
            u2,
            pc,
            extra,
            old_errfunc,
            ctx,
        })
    }
}

/// After a suspended coroutine's frames (format 4 on): the stack offsets of its pending
/// to-be-closed variables, oldest first.
pub struct PendingCloses;

impl PendingCloses {
    pub fn encode(w: &mut Writer, slots: impl ExactSizeIterator<Item = u64>) {
        w.varint(slots.len() as u64);
        for s in slots {
            w.varint(s);
        }
    }

    /// The offsets, each at most `i32::MAX`.
    pub fn decode(r: &mut Reader<'_>) -> Result<Vec<i32>, Bad> {
        let Some(n) = r.varint().filter(|&n| n <= r.remaining() as u64) else {
            return Err("bad to-be-closed variable count");
        };
        let mut slots = Vec::with_capacity(n as usize);
        for _ in 0..n {
            match r.varint() {
                Some(v) if v <= i32::MAX as u64 => slots.push(v as i32),
                _ => return Err("bad to-be-closed variable"),
            }
        }
        Ok(slots)
    }
}

/// Where a prototype lives ([`ProtoRecord::home`], a varint: 0, or the chunk's index + 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProtoHome {
    /// Compiled outside the chunk registry: a [`Detached`] record follows.
    Detached,
    /// In chunk `c`: its [`ChunkDef`] at the chunk's first occurrence, then the [`ProtoPath`].
    Chunk(u64),
}

/// A prototype at its first occurrence (format 4 on), after its index (see
/// [`ProtoRecord::index`]): its fingerprint, the line it is defined at, and its home.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProtoRecord {
    pub hash: u64,
    pub line: u64,
    pub home: ProtoHome,
}

impl ProtoRecord {
    /// Writes a prototype's index (the record follows at its first occurrence).
    #[inline(always)]
    pub fn encode_index(w: &mut Writer, index: u64) {
        w.varint(index);
    }

    /// A prototype's index: one listed before, or the next (then its record follows).
    pub fn index(r: &mut Reader<'_>) -> Result<u64, Bad> {
        r.varint().ok_or("bad prototype")
    }

    pub fn encode(&self, w: &mut Writer) {
        w.u64(self.hash);
        w.varint(self.line);
        w.varint(match self.home {
            ProtoHome::Detached => 0,
            ProtoHome::Chunk(c) => c + 1,
        });
    }

    pub fn decode(r: &mut Reader<'_>) -> Result<Self, Bad> {
        let (Some(hash), Some(line), Some(home)) = (r.u64(), r.varint(), r.varint()) else {
            return Err("bad prototype");
        };
        let home = match home {
            0 => ProtoHome::Detached,
            c => ProtoHome::Chunk(c - 1),
        };
        Ok(ProtoRecord { hash, line, home })
    }
}

/// After a detached prototype's record: its short source and its bytecode (or nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detached<B> {
    pub src: B,
    pub code: B,
}

impl<B: AsRef<[u8]>> Detached<B> {
    pub fn encode(&self, w: &mut Writer) {
        w.bytes(self.src.as_ref());
        w.bytes(self.code.as_ref());
    }
}

impl<'a> Detached<&'a [u8]> {
    pub fn decode(r: &mut Reader<'a>) -> Result<Self, Bad> {
        match (r.bytes(), r.bytes()) {
            (Some(src), Some(code)) => Ok(Detached { src, code }),
            _ => Err("bad prototype"),
        }
    }
}

/// A prototype at its first occurrence in formats 1 to 3: fingerprint, short source, line,
/// bytecode (or nothing). Only read: this build writes format 5.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LegacyProto<B> {
    pub hash: u64,
    pub src: B,
    pub line: u64,
    pub code: B,
}

impl<'a> LegacyProto<&'a [u8]> {
    pub fn decode(r: &mut Reader<'a>) -> Result<Self, Bad> {
        let (Some(hash), Some(src), Some(line), Some(code)) =
            (r.u64(), r.bytes(), r.varint(), r.bytes())
        else {
            return Err("bad prototype");
        };
        Ok(LegacyProto {
            hash,
            src,
            line,
            code,
        })
    }
}

/// A chunk at its first occurrence (after the home of a prototype in it): its kind (0 source
/// text, 1 binary), its name, its main prototype's fingerprint and its code (the text or the
/// binary chunk, or nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkDef<B> {
    /// 0 source text, 1 binary.
    pub kind: u8,
    /// The chunk name (`@file.lua`, `=stdin`).
    pub name: B,
    /// The fingerprint of its main prototype.
    pub main_hash: u64,
    /// Its source text or binary chunk, or nothing (the options left it out).
    pub code: B,
}

impl<B: AsRef<[u8]>> ChunkDef<B> {
    /// Writes the record.
    pub fn encode(&self, w: &mut Writer) {
        w.u8(self.kind);
        w.bytes(self.name.as_ref());
        w.u64(self.main_hash);
        w.bytes(self.code.as_ref());
    }
}

impl<'a> ChunkDef<&'a [u8]> {
    /// Reads the record (a kind other than 0 or 1 is refused).
    pub fn decode(r: &mut Reader<'a>) -> Result<Self, Bad> {
        let (Some(kind), Some(name), Some(main_hash), Some(code)) =
            (r.u8(), r.bytes(), r.u64(), r.bytes())
        else {
            return Err("bad chunk");
        };
        if kind > 1 {
            return Err("bad chunk kind");
        }
        Ok(ChunkDef {
            kind,
            name,
            main_hash,
            code,
        })
    }
}

/// The path of a prototype in its chunk's tree: a depth (at most [`MAX_PATH`]), then that many
/// child indices from the chunk's main prototype. Decoded a step at a time: a loader follows
/// each step into the tree as it reads it.
pub struct ProtoPath;

impl ProtoPath {
    pub fn encode(w: &mut Writer, path: impl ExactSizeIterator<Item = u64>) {
        w.varint(path.len() as u64);
        for i in path {
            w.varint(i);
        }
    }

    pub fn depth(r: &mut Reader<'_>) -> Result<u64, Bad> {
        r.varint()
            .filter(|&d| d <= MAX_PATH)
            .ok_or("bad prototype path")
    }

    pub fn step(r: &mut Reader<'_>) -> Result<u64, Bad> {
        r.varint().ok_or("bad prototype path")
    }
}

/// From format 6, after a chunk prototype's path: its place (the names from the chunk's main
/// prototype down, one per step of the path; `persist::place`), then its upvalues' names (at
/// most [`MAX_UPVALUE_NAMES`]): each list a count, then each name's bytes.
pub struct ProtoNames;

impl ProtoNames {
    pub fn encode<'n>(w: &mut Writer, names: impl ExactSizeIterator<Item = &'n [u8]>) {
        w.varint(names.len() as u64);
        for name in names {
            w.bytes(name);
        }
    }

    /// Reads a list of at most `max` names.
    pub fn decode(r: &mut Reader<'_>, max: u64) -> Result<Vec<Vec<u8>>, Bad> {
        let n = r
            .varint()
            .filter(|&n| n <= max)
            .ok_or("bad prototype names")?;
        let mut names = Vec::with_capacity(n as usize);
        for _ in 0..n {
            names.push(r.bytes().ok_or("bad prototype names")?.to_vec());
        }
        Ok(names)
    }
}

/// After `Tag::UpvalRef`: the upvalue is shared with upvalue `index` of the closure with object
/// id `closure`, read before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpvalueRef {
    pub closure: u64,
    pub index: u64,
}

impl UpvalueRef {
    /// Writes `Tag::UpvalRef` and the record.
    #[inline(always)]
    pub fn encode(&self, w: &mut Writer) {
        w.tag(Tag::UpvalRef);
        w.varint(self.closure);
        w.varint(self.index);
    }

    #[inline(always)]
    pub fn decode(r: &mut Reader<'_>) -> Result<Self, Bad> {
        match (r.varint(), r.varint()) {
            (Some(closure), Some(index)) => Ok(UpvalueRef { closure, index }),
            _ => Err("bad upvalue reference"),
        }
    }
}

/// After `Tag::UpvalOpen`: the upvalue is open, stack slot `level` (1-based, at most
/// [`MAX_COROUTINE_STACK`]) of the coroutine that follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenUpvalue {
    pub level: u64,
}

impl OpenUpvalue {
    /// Writes `Tag::UpvalOpen` and the record.
    pub fn encode(&self, w: &mut Writer) {
        w.tag(Tag::UpvalOpen);
        w.varint(self.level);
    }

    pub fn decode(r: &mut Reader<'_>) -> Result<Self, Bad> {
        match r.varint() {
            Some(level) if level != 0 && level <= MAX_COROUTINE_STACK => Ok(OpenUpvalue { level }),
            _ => Err("bad open upvalue"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes `enc` writes, after checking the tag it starts with (if any).
    fn encoded(enc: impl Fn(&mut Writer), tag: Option<Tag>) -> Vec<u8> {
        let mut w = Writer::default();
        enc(&mut w);
        if let Some(t) = tag {
            assert_eq!(w.buf.first(), Some(&(t as u8)));
            w.buf.remove(0);
        }
        w.buf
    }

    /// Encodes with `enc`, decodes with `dec`: the record `want`, every byte read.
    macro_rules! round_trip {
        ($enc:expr, $dec:expr, $want:expr, $tag:expr $(,)?) => {{
            let b = encoded($enc, $tag);
            let mut r = Reader::new(&b);
            assert_eq!($dec(&mut r), Ok($want));
            assert_eq!(r.remaining(), 0);
        }};
    }

    #[test]
    fn records_round_trip() {
        let t = TableHeader {
            narr: 300,
            nhash: 2,
        };
        round_trip!(|w| t.encode(w), TableHeader::decode, t, Some(Tag::Table));
        let u = UserdataBytes {
            bytes: &b"xyz"[..],
            nuv: 0,
        };
        round_trip!(
            |w| u.encode(w),
            UserdataBytes::decode,
            u.clone(),
            Some(Tag::UdBytes),
        );
        let p = PlainUserdata {
            name: &b"Vec"[..],
            bytes: &[1u8, 2][..],
        };
        round_trip!(
            |w| p.encode(w),
            PlainUserdata::decode,
            p.clone(),
            Some(Tag::UdPlain),
        );
        for h in [
            ThreadHeader::Dead,
            ThreadHeader::NotStarted { stack: 1 },
            ThreadHeader::Suspended {
                stack: 2,
                errfunc: -1,
            },
        ] {
            let dec = |r: &mut Reader<'_>| -> Result<ThreadHeader, Bad> {
                let state = ThreadHeader::state(r)?;
                let h = ThreadHeader::decode(state, r)?;
                // The stack values the size promises (the check counts the bytes left).
                r.pos += h.stack() as usize;
                Ok(h)
            };
            let enc = |w: &mut Writer| {
                h.encode(w);
                w.buf.extend(std::iter::repeat_n(0, h.stack() as usize));
            };
            round_trip!(enc, dec, h, Some(Tag::Thread));
        }
        let f = CallFrame {
            func: 1,
            top: 20,
            callstatus: 1 << 15,
            u2: -3,
            pc: 7,
            extra: 2,
            old_errfunc: -1,
            ctx: 5,
        };
        round_trip!(|w| f.encode(w), CallFrame::decode, f, None);
        let pr = ProtoRecord {
            hash: 0xfeed,
            line: 12,
            home: ProtoHome::Chunk(3),
        };
        round_trip!(|w| pr.encode(w), ProtoRecord::decode, pr, None);
        let c = ChunkDef {
            kind: 1,
            name: &b"@a.lua"[..],
            main_hash: 9,
            code: &b"\x1bLua"[..],
        };
        round_trip!(|w| c.encode(w), ChunkDef::decode, c.clone(), None);
        let d = Detached {
            src: &b"=x"[..],
            code: &[][..],
        };
        round_trip!(|w| d.encode(w), Detached::decode, d.clone(), None);
        let l = LegacyProto {
            hash: 1,
            src: &b"=x"[..],
            line: 3,
            code: &[][..],
        };
        let legacy = |w: &mut Writer| {
            w.u64(1);
            w.bytes(b"=x");
            w.varint(3);
            w.bytes(&[]);
        };
        round_trip!(legacy, LegacyProto::decode, l.clone(), None);
        let u = UpvalueRef {
            closure: 4,
            index: 1,
        };
        round_trip!(|w| u.encode(w), UpvalueRef::decode, u, Some(Tag::UpvalRef));
        let o = OpenUpvalue { level: 3 };
        round_trip!(
            |w| o.encode(w),
            OpenUpvalue::decode,
            o,
            Some(Tag::UpvalOpen),
        );
        round_trip!(
            |w| PendingCloses::encode(w, [3u64, 9].into_iter()),
            PendingCloses::decode,
            vec![3, 9],
            None,
        );
        round_trip!(
            |w| ProtoPath::encode(w, [0u64, 2].into_iter()),
            |r: &mut Reader<'_>| -> Result<_, Bad> {
                Ok((
                    ProtoPath::depth(r)?,
                    ProtoPath::step(r)?,
                    ProtoPath::step(r)?,
                ))
            },
            (2, 0, 2),
            None,
        );
    }

    #[test]
    fn fields_out_of_their_range_are_refused_where_the_loader_refuses_them() {
        let mut w = Writer::default();
        CallFrame {
            func: 1 << 31,
            top: 0,
            callstatus: 0,
            u2: 0,
            pc: 0,
            extra: 0,
            old_errfunc: 0,
            ctx: 0,
        }
        .encode(&mut w);
        let mut r = Reader::new(&w.buf);
        assert_eq!(
            CallFrame::decode(&mut r),
            Err("coroutine frame field out of range")
        );
        // All eight fields were read: the error names the byte after them.
        assert_eq!(r.remaining(), 0);
        assert_eq!(
            ThreadHeader::decode(ThreadHeader::SUSPENDED, &mut Reader::new(&[5, 0])),
            Err("bad coroutine stack size"),
            "five values promised, one byte left"
        );
        assert_eq!(
            ThreadHeader::decode(7, &mut Reader::new(&[])),
            Err("unknown coroutine state")
        );
        assert_eq!(
            ChunkDef::decode(&mut Reader::new(&[2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])),
            Err("bad chunk kind")
        );
        assert_eq!(
            OpenUpvalue::decode(&mut Reader::new(&[0])),
            Err("bad open upvalue")
        );
        assert_eq!(
            ProtoPath::depth(&mut Reader::new(&[0x81, 0x02])),
            Err("bad prototype path"),
            "deeper than MAX_PATH"
        );
        let mut w = Writer::default();
        UserdataBytes {
            bytes: &[][..],
            nuv: 70_000,
        }
        .encode(&mut w);
        let mut r = Reader::new(&w.buf[1..]);
        assert_eq!(UserdataBytes::decode(&mut r), Err("too many user values"));
    }
}
