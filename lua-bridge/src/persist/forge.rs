//! The save-game body as a tree: decoded from a file, edited, encoded again behind a valid
//! header. For hostile-file tests and the structure-aware fuzz target: a checksum is no
//! defence (anyone can recompute it), so the loader is attacked with files that are
//! well-formed in every respect but the one being forged.
//!
//! The tree mirrors the format one to one, counts included: a count that disagrees with the
//! items that follow is written as is, so forged counts can be expressed. Every node encodes
//! and decodes through the format's records (`format/`): a node holds a record whole
//! ([`CallFrame`], [`ChunkDef`]) or the fields its constructor takes, so a record that changes
//! changes here too, or fails to compile here.

use super::format::{
    open, After, CallFrame, Detached, OpenUpvalue, PendingCloses, PlainUserdata, ProtoHome,
    ProtoNames, ProtoPath, ProtoRecord, Reader, Scalar, SpecialParts, TableHeader, Tag,
    ThreadHeader, ThreadPart, ThreadParts, UpvalueRef, Upvalues, UserdataBytes, UserdataPart,
    UserdataParts, Writer, FLAG_BYTECODE, FLAG_QUOTED_PLACES, FORMAT_VERSION, MAX_PATH,
    MAX_UPVALUE_NAMES,
};

pub use super::format::ChunkDef;

/// `CallInfo.callstatus` bits of Lua 5.5.1 (lstate.h), for forging frame records.
pub mod cist {
    /// Results the caller wants, plus one (0: all).
    pub const NRESULTS: u32 = 0xff;
    /// A C function's frame.
    pub const C: u32 = 1 << 15;
    /// Entered by a fresh `luaV_execute`.
    pub const FRESH: u32 = C << 1;
    /// A protected call that yielded.
    pub const YPCALL: u32 = C << 6;
    /// Entered by a tail call.
    pub const TAIL: u32 = C << 7;
}

/// One value of a body.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    Nil,
    False,
    True,
    Int(i64),
    /// A float, by its bits.
    Float(u64),
    Str(Vec<u8>),
    Light(u64),
    /// A string id.
    StrRef(u64),
    /// An object id.
    Ref(u64),
    /// A permanent, by its key.
    Perm(Box<Node>),
    /// A table's hash-part layout (the bytes after `Tag::Layout`): as the key of a table's
    /// last entry (whose value is ignored), it ends the entries instead of `Nil`.
    Layout(Vec<u8>),
    Table {
        narr: u64,
        nhash: u64,
        meta: Box<Node>,
        entries: Vec<(Node, Node)>,
    },
    /// A Lua closure: its prototype and `n` upvalues (`upvals` is what follows).
    LClosure {
        proto: Proto,
        n: u64,
        upvals: Vec<Upval>,
    },
    /// A C closure: the permanent key of its bare function and `n` upvalues.
    CClosure {
        name: Box<Node>,
        n: u64,
        upvals: Vec<Node>,
    },
    /// A userdata by bytes with `nuv` user values (`meta` then `uvs` follow).
    UdBytes {
        bytes: Vec<u8>,
        nuv: u64,
        meta: Box<Node>,
        uvs: Vec<Node>,
    },
    UdPlain {
        name: Vec<u8>,
        bytes: Vec<u8>,
    },
    /// `__persist` rebuild function.
    Thunk(Box<Node>),
    /// `__persist` create and init functions.
    TwoPhase(Box<Node>, Box<Node>),
    ThreadDead,
    /// A coroutine not started: `n` stack values (function and arguments).
    ThreadNotStarted {
        n: u64,
        stack: Vec<Node>,
    },
    /// A suspended coroutine: `n` stack values, then `nci` frame records.
    ThreadSuspended {
        n: u64,
        errfunc: i64,
        stack: Vec<Node>,
        nci: u64,
        frames: Vec<FrameRec>,
        /// Stack offsets of pending to-be-closed variables, oldest first.
        tbc: Vec<u64>,
    },
    MainThread,
    /// An identity as a table key (format 7 on), then the value it is for (a new object in a
    /// valid file; any value, and any number, in a forged one).
    Ident(u64, Box<Node>),
    /// A finalization mark (format 8 on: 0 not marked, n + 1 marked n-th), then the value it
    /// is for (a new table or userdata from bytes, maybe after its identity, in a valid file;
    /// any value, and any number, in a forged one).
    Final(u64, Box<Node>),
    /// Bytes written as they are (anything the tree cannot say).
    Raw(Vec<u8>),
    /// A body with objects awaiting finalization after its root: the root, their count `n`
    /// (as is: any number in a forged file), then the values (`list`); written with its
    /// part's tag (`After::Pending`, format 10). Decoded only at the top of a body that has
    /// bytes after its root.
    Pending {
        root: Box<Node>,
        n: u64,
        list: Vec<Node>,
    },
    /// A body (the root, perhaps with a `Pending` part) with removed keys after it
    /// (`After::RemovedKeys`, format 10): their count `n` (as is), then per entry the table's
    /// object id, the node, the dead flag (any numbers in a forged file) and the key (a `Ref`,
    /// `StrRef` or `Perm` in a valid file; any value in a forged one).
    RemovedKeys {
        root: Box<Node>,
        n: u64,
        entries: Vec<(u64, u64, u64, Node)>,
    },
    /// A body (the root, perhaps with the parts above) with the removed keys of the loading
    /// VM's own `_G` and `package.loaded` after it (`After::GameRemovedKeys`, format 11): as
    /// `RemovedKeys`, with the table 0 (`_G`) or 1 (`package.loaded`) in a valid file.
    GameRemovedKeys {
        root: Box<Node>,
        n: u64,
        entries: Vec<(u64, u64, u64, Node)>,
    },
}

/// A closure's prototype: an index into those already listed, or a new one.
// A test and fuzzing tree, built rarely: the size of `New` (its `Home`) costs nothing here.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Proto {
    Index(u64),
    /// `src` and `code` (short source, bytecode) are written only for a detached prototype
    /// (`home: None`).
    New {
        index: u64,
        hash: u64,
        src: Vec<u8>,
        line: u64,
        code: Vec<u8>,
        home: Option<Home>,
    },
}

/// Where a prototype lives: chunk `chunk` (with its definition at its first occurrence), the
/// path of child indices from the chunk's main prototype, its place (names from the main
/// prototype down) and its upvalues' names (format 6).
#[derive(Debug, Clone, PartialEq)]
pub struct Home {
    pub chunk: u64,
    pub def: Option<ChunkDef<Vec<u8>>>,
    pub path: Vec<u64>,
    pub place: Vec<Vec<u8>>,
    pub upvalues: Vec<Vec<u8>>,
}

/// A Lua closure's upvalue.
#[derive(Debug, Clone, PartialEq)]
pub enum Upval {
    New(Node),
    /// Shared with upvalue `index` of the closure with object id `closure`.
    Ref {
        closure: u64,
        index: u64,
    },
    /// Open: stack slot `level` of the coroutine that follows.
    Open {
        level: u64,
        thread: Node,
    },
}

/// A frame record of a suspended coroutine: the format's [`CallFrame`] and its continuation.
#[derive(Debug, Clone, PartialEq)]
pub struct FrameRec {
    pub frame: CallFrame,
    /// The continuation: `None` (a `Nil` tag) or a permanent's name.
    pub k: Option<Node>,
}

const MAX_DEPTH: usize = 256;

impl Node {
    /// The node as a value without children, if it is one.
    fn scalar(&self) -> Option<Scalar<&[u8]>> {
        Some(match self {
            Node::Nil => Scalar::Nil,
            Node::False => Scalar::False,
            Node::True => Scalar::True,
            Node::Int(v) => Scalar::Int(*v),
            Node::Float(bits) => Scalar::Float(*bits),
            Node::Str(b) => Scalar::Str(&b[..]),
            Node::Light(p) => Scalar::Light(*p),
            Node::StrRef(sid) => Scalar::StrRef(*sid),
            Node::Ref(id) => Scalar::Ref(*id),
            _ => return None,
        })
    }
}

impl From<Scalar<&[u8]>> for Node {
    fn from(s: Scalar<&[u8]>) -> Node {
        match s {
            Scalar::Nil => Node::Nil,
            Scalar::False => Node::False,
            Scalar::True => Node::True,
            Scalar::Int(v) => Node::Int(v),
            Scalar::Float(bits) => Node::Float(bits),
            Scalar::Str(b) => Node::Str(b.to_vec()),
            Scalar::Light(p) => Node::Light(p),
            Scalar::StrRef(sid) => Node::StrRef(sid),
            Scalar::Ref(id) => Node::Ref(id),
        }
    }
}

/// Decodes a body (not a file: see [`body_of`]). `None` if it is malformed or nests deeper
/// than the decoder goes.
pub fn decode(body: &[u8]) -> Option<Node> {
    let mut d = Decoder {
        r: Reader::new(body),
        protos: 0,
        chunks: 0,
    };
    let mut n = d.node(0)?;
    let mut last = 0;
    while let Some(tag) = d.r.u8() {
        if tag <= last {
            return None;
        }
        last = tag;
        let count = d.r.varint()?;
        n = match After::from_u8(tag)? {
            After::Pending => Node::Pending {
                root: Box::new(n),
                n: count,
                list: d.list(count, 0)?,
            },
            After::RemovedKeys => Node::RemovedKeys {
                root: Box::new(n),
                n: count,
                entries: d.removed_entries(count)?,
            },
            After::GameRemovedKeys => Node::GameRemovedKeys {
                root: Box::new(n),
                n: count,
                entries: d.removed_entries(count)?,
            },
        };
    }
    Some(n)
}

/// Decodes nodes, numbering prototypes and chunks by their first occurrence as the loader
/// does.
struct Decoder<'a> {
    r: Reader<'a>,
    protos: u64,
    chunks: u64,
}

impl Decoder<'_> {
    /// `n` entries of a removed-keys part (table, node, dead flag, key), if the bytes left
    /// can hold them.
    fn removed_entries(&mut self, n: u64) -> Option<Vec<(u64, u64, u64, Node)>> {
        if n > self.r.remaining() as u64 {
            return None;
        }
        (0..n)
            .map(|_| {
                let (t, node, dead) = (self.r.varint()?, self.r.varint()?, self.r.varint()?);
                Some((t, node, dead, self.node(1)?))
            })
            .collect()
    }

    /// `n` values, if the bytes left can hold them.
    fn list(&mut self, n: u64, depth: usize) -> Option<Vec<Node>> {
        if n > self.r.remaining() as u64 {
            return None;
        }
        (0..n).map(|_| self.node(depth + 1)).collect()
    }

    fn boxed(&mut self, depth: usize) -> Option<Box<Node>> {
        Some(Box::new(self.node(depth + 1)?))
    }

    fn node(&mut self, depth: usize) -> Option<Node> {
        if depth > MAX_DEPTH {
            return None;
        }
        let tag = Tag::from_u8(self.r.u8()?)?;
        Some(match tag {
            Tag::Nil
            | Tag::False
            | Tag::True
            | Tag::Int
            | Tag::Float
            | Tag::Str
            | Tag::Light
            | Tag::StrRef
            | Tag::Ref => Node::from(Scalar::decode(tag, &mut self.r).ok()?),
            Tag::Layout => Node::Layout(self.r.bytes()?.to_vec()),
            Tag::Perm => Node::Perm(self.boxed(depth)?),
            Tag::Table => self.table(depth)?,
            Tag::LClosure => self.lclosure(depth)?,
            Tag::CClosure => {
                let name = self.boxed(depth)?;
                let n = self.r.varint()?;
                let upvals = self.list(n, depth)?;
                Node::CClosure { name, n, upvals }
            }
            Tag::UdBytes => self.userdata(depth)?,
            Tag::UdPlain => {
                let PlainUserdata { name, bytes } = PlainUserdata::decode(&mut self.r).ok()?;
                Node::UdPlain {
                    name: name.to_vec(),
                    bytes: bytes.to_vec(),
                }
            }
            Tag::Thunk | Tag::TwoPhase => self.special(tag == Tag::TwoPhase, depth)?,
            Tag::Thread => self.thread(depth)?,
            Tag::MainThread => Node::MainThread,
            Tag::Ident => {
                let ident = self.r.varint()?;
                Node::Ident(ident, self.boxed(depth)?)
            }
            Tag::Final => {
                let mark = self.r.varint()?;
                Node::Final(mark, self.boxed(depth)?)
            }
            Tag::UpvalNew | Tag::UpvalRef | Tag::UpvalOpen => return None,
        })
    }

    /// A table after its tag: header, metatable, entries until its end marker (a layout is
    /// kept as the key of a last entry).
    fn table(&mut self, depth: usize) -> Option<Node> {
        let TableHeader { narr, nhash } = TableHeader::decode(&mut self.r).ok()?;
        let meta = self.boxed(depth)?;
        let mut entries = Vec::new();
        loop {
            match self.r.peek().and_then(Tag::from_u8) {
                Some(Tag::Nil) => {
                    self.r.pos += 1;
                    break;
                }
                Some(Tag::Layout) => {
                    self.r.pos += 1;
                    let b = self.r.bytes()?.to_vec();
                    entries.push((Node::Layout(b), Node::Nil));
                    break;
                }
                _ => {
                    let k = self.node(depth + 1)?;
                    let v = self.node(depth + 1)?;
                    entries.push((k, v));
                }
            }
        }
        Some(Node::Table {
            narr,
            nhash,
            meta,
            entries,
        })
    }

    /// A Lua closure after its tag: its prototype, then its upvalues.
    fn lclosure(&mut self, depth: usize) -> Option<Node> {
        let proto = self.proto()?;
        let n = self.r.varint()?;
        if n > self.r.remaining() as u64 {
            return None;
        }
        let mut upvals = Vec::new();
        for _ in Upvalues::new(n as u32) {
            upvals.push(match Tag::from_u8(self.r.u8()?)? {
                Tag::UpvalNew => Upval::New(self.node(depth + 1)?),
                Tag::UpvalRef => {
                    let UpvalueRef { closure, index } = UpvalueRef::decode(&mut self.r).ok()?;
                    Upval::Ref { closure, index }
                }
                Tag::UpvalOpen => {
                    let OpenUpvalue { level } = OpenUpvalue::decode(&mut self.r).ok()?;
                    let thread = self.node(depth + 1)?;
                    Upval::Open { level, thread }
                }
                _ => return None,
            });
        }
        Some(Node::LClosure { proto, n, upvals })
    }

    /// A closure's prototype: its index, and at its first occurrence its record and home.
    fn proto(&mut self) -> Option<Proto> {
        let index = ProtoRecord::index(&mut self.r).ok()?;
        if index != self.protos {
            return Some(Proto::Index(index));
        }
        self.protos += 1;
        let ProtoRecord { hash, line, home } = ProtoRecord::decode(&mut self.r).ok()?;
        let chunk = match home {
            ProtoHome::Detached => {
                let Detached { src, code } = Detached::decode(&mut self.r).ok()?;
                return Some(Proto::New {
                    index,
                    hash,
                    src: src.to_vec(),
                    line,
                    code: code.to_vec(),
                    home: None,
                });
            }
            ProtoHome::Chunk(c) => c,
        };
        let def = if chunk == self.chunks {
            self.chunks += 1;
            let d = ChunkDef::decode(&mut self.r).ok()?;
            Some(ChunkDef {
                kind: d.kind,
                name: d.name.to_vec(),
                main_hash: d.main_hash,
                code: d.code.to_vec(),
            })
        } else {
            None
        };
        let depth = ProtoPath::depth(&mut self.r).ok()?;
        let path = (0..depth)
            .map(|_| ProtoPath::step(&mut self.r).ok())
            .collect::<Option<Vec<_>>>()?;
        let place = ProtoNames::decode(&mut self.r, MAX_PATH).ok()?;
        let upvalues = ProtoNames::decode(&mut self.r, MAX_UPVALUE_NAMES).ok()?;
        Some(Proto::New {
            index,
            hash,
            src: Vec::new(),
            line,
            code: Vec::new(),
            home: Some(Home {
                chunk,
                def,
                path,
                place,
                upvalues,
            }),
        })
    }

    /// A userdata by bytes after its tag: the record, then its parts.
    fn userdata(&mut self, depth: usize) -> Option<Node> {
        let UserdataBytes { bytes, nuv } = UserdataBytes::decode(&mut self.r).ok()?;
        let (mut meta, mut uvs) = (Box::new(Node::Nil), Vec::new());
        for part in UserdataParts::new(nuv as u32) {
            let v = self.node(depth + 1)?;
            match part {
                UserdataPart::Metatable => *meta = v,
                UserdataPart::UserValue(_) => uvs.push(v),
            }
        }
        Some(Node::UdBytes {
            bytes: bytes.to_vec(),
            nuv,
            meta,
            uvs,
        })
    }

    /// An object rebuilt by its `__persist` function, after its tag: its function(s).
    fn special(&mut self, two_phase: bool, depth: usize) -> Option<Node> {
        let mut fs = Vec::new();
        for _ in SpecialParts::new(two_phase) {
            fs.push(self.boxed(depth)?);
        }
        let mut fs = fs.into_iter();
        let first = fs.next()?;
        Some(match fs.next() {
            Some(init) => Node::TwoPhase(first, init),
            None => Node::Thunk(first),
        })
    }

    /// A coroutine after its tag: its header, its stack values, and for a suspended one its
    /// frames (each with its continuation) and pending to-be-closed variables.
    fn thread(&mut self, depth: usize) -> Option<Node> {
        let state = ThreadHeader::state(&mut self.r).ok()?;
        let header = ThreadHeader::decode(state, &mut self.r).ok()?;
        let n = header.stack();
        let mut stack = Vec::new();
        let mut parts = ThreadParts::new(n as u32);
        while let ThreadPart::Slot(_) = parts.next_part() {
            stack.push(self.node(depth + 1)?);
        }
        let errfunc = match header {
            ThreadHeader::Dead => return Some(Node::ThreadDead),
            ThreadHeader::NotStarted { .. } => return Some(Node::ThreadNotStarted { n, stack }),
            ThreadHeader::Suspended { errfunc, .. } => errfunc,
        };
        let nci = CallFrame::count(&mut self.r).ok()?;
        let mut frames = Vec::new();
        for _ in 0..nci {
            let frame = CallFrame::decode(&mut self.r).ok()?;
            let k = if self.r.peek() == Some(Tag::Nil as u8) {
                self.r.pos += 1;
                None
            } else {
                Some(self.node(depth + 1)?)
            };
            frames.push(FrameRec { frame, k });
        }
        let tbc = PendingCloses::decode(&mut self.r).ok()?;
        Some(Node::ThreadSuspended {
            n,
            errfunc,
            stack,
            nci,
            frames,
            tbc: tbc.into_iter().map(|s| s as u64).collect(),
        })
    }
}

/// Encodes a tree as a body.
pub fn encode(node: &Node) -> Vec<u8> {
    let mut w = Writer::default();
    put(&mut w, node);
    w.buf
}

/// Encodes a tree as a whole file: a valid header and checksum, then the body.
pub fn file(node: &Node) -> Vec<u8> {
    seal_body(&encode(node), true)
}

/// The header flags every file this build writes carries, whatever its body holds: its places
/// quote keys that are no names ([`FLAG_QUOTED_PLACES`]). A forged file has them too, so it
/// reads as a file of this build, not as one from before.
pub const CURRENT_FLAGS: u8 = FLAG_QUOTED_PLACES;

/// Wraps a body in a valid header (checksum included) of this build's format, with the
/// [`CURRENT_FLAGS`] and the bytecode flag if `with_bytecode`: mutated or forged bodies get
/// past the checksum, so the parser itself is exercised.
pub fn seal_body(body: &[u8], with_bytecode: bool) -> Vec<u8> {
    let bytecode = if with_bytecode { FLAG_BYTECODE } else { 0 };
    seal_old_body(body, FORMAT_VERSION, CURRENT_FLAGS | bytecode)
}

/// Wraps a body in a valid header that claims format `format` and exactly `flags`: a save
/// from an older build on purpose (for instance one without [`FLAG_QUOTED_PLACES`], whose
/// places read `M["a.b"]` as `M.a.b`), for tests of how old saves load.
pub fn seal_old_body(body: &[u8], format: u16, flags: u8) -> Vec<u8> {
    let mut w = Writer::default();
    w.buf.extend_from_slice(body);
    let mut file = w.finish(flags);
    // The version sits after the magic; the checksum covers the body only.
    file[8..10].copy_from_slice(&format.to_le_bytes());
    file
}

/// The body of a save-game (after its header), if the header is valid.
pub fn body_of(file: &[u8]) -> Option<&[u8]> {
    open(file).ok().map(|o| o.body)
}

fn put(w: &mut Writer, node: &Node) {
    if let Some(s) = node.scalar() {
        s.encode(w);
        return;
    }
    match node {
        Node::Layout(b) => {
            w.tag(Tag::Layout);
            w.bytes(b);
        }
        Node::Perm(k) => {
            w.tag(Tag::Perm);
            put(w, k);
        }
        Node::Table {
            narr,
            nhash,
            meta,
            entries,
        } => {
            let header = TableHeader {
                narr: *narr,
                nhash: *nhash,
            };
            header.encode(w);
            put(w, meta);
            for (k, v) in entries {
                put(w, k);
                if let Node::Layout(_) = k {
                    return;
                }
                put(w, v);
            }
            w.tag(Tag::Nil);
        }
        Node::LClosure { proto, n, upvals } => {
            w.tag(Tag::LClosure);
            put_proto(w, proto);
            w.varint(*n);
            upvals.iter().for_each(|u| put_upval(w, u));
        }
        Node::CClosure { name, n, upvals } => {
            w.tag(Tag::CClosure);
            put(w, name);
            w.varint(*n);
            upvals.iter().for_each(|v| put(w, v));
        }
        Node::UdBytes {
            bytes,
            nuv,
            meta,
            uvs,
        } => {
            let nuv = *nuv;
            UserdataBytes { bytes, nuv }.encode(w);
            put(w, meta);
            uvs.iter().for_each(|v| put(w, v));
        }
        Node::UdPlain { name, bytes } => PlainUserdata { name, bytes }.encode(w),
        Node::Thunk(f) => {
            w.tag(Tag::Thunk);
            put(w, f);
        }
        Node::TwoPhase(a, b) => {
            w.tag(Tag::TwoPhase);
            put(w, a);
            put(w, b);
        }
        Node::MainThread => w.tag(Tag::MainThread),
        Node::Ident(ident, v) => {
            w.tagged(Tag::Ident, *ident);
            put(w, v);
        }
        Node::Final(mark, v) => {
            w.tagged(Tag::Final, *mark);
            put(w, v);
        }
        Node::Pending { root, n, list } => {
            put(w, root);
            w.u8(After::Pending as u8);
            w.varint(*n);
            list.iter().for_each(|v| put(w, v));
        }
        Node::RemovedKeys { root, n, entries } | Node::GameRemovedKeys { root, n, entries } => {
            put(w, root);
            w.u8(match node {
                Node::RemovedKeys { .. } => After::RemovedKeys,
                _ => After::GameRemovedKeys,
            } as u8);
            w.varint(*n);
            for (t, node, dead, key) in entries {
                w.varint(*t);
                w.varint(*node);
                w.varint(*dead);
                put(w, key);
            }
        }
        Node::Raw(b) => w.buf.extend_from_slice(b),
        _ => put_thread(w, node),
    }
}

fn put_proto(w: &mut Writer, proto: &Proto) {
    let (index, hash, src, line, code, home) = match proto {
        Proto::Index(i) => return ProtoRecord::encode_index(w, *i),
        Proto::New {
            index,
            hash,
            src,
            line,
            code,
            home,
        } => (*index, *hash, src, *line, code, home),
    };
    ProtoRecord::encode_index(w, index);
    let Some(h) = home else {
        let home = ProtoHome::Detached;
        ProtoRecord { hash, line, home }.encode(w);
        return Detached { src, code }.encode(w);
    };
    let home = ProtoHome::Chunk(h.chunk);
    ProtoRecord { hash, line, home }.encode(w);
    if let Some(d) = &h.def {
        d.encode(w);
    }
    ProtoPath::encode(w, h.path.iter().copied());
    ProtoNames::encode(w, h.place.iter().map(Vec::as_slice));
    ProtoNames::encode(w, h.upvalues.iter().map(Vec::as_slice));
}

fn put_upval(w: &mut Writer, u: &Upval) {
    match u {
        Upval::New(v) => {
            w.tag(Tag::UpvalNew);
            put(w, v);
        }
        Upval::Ref { closure, index } => {
            let (closure, index) = (*closure, *index);
            UpvalueRef { closure, index }.encode(w);
        }
        Upval::Open { level, thread } => {
            OpenUpvalue { level: *level }.encode(w);
            put(w, thread);
        }
    }
}

/// A coroutine node (the other nodes are not coroutines: nothing).
fn put_thread(w: &mut Writer, node: &Node) {
    match node {
        Node::ThreadDead => ThreadHeader::Dead.encode(w),
        Node::ThreadNotStarted { n, stack } => {
            ThreadHeader::NotStarted { stack: *n }.encode(w);
            stack.iter().for_each(|v| put(w, v));
        }
        Node::ThreadSuspended {
            n,
            errfunc,
            stack,
            nci,
            frames,
            tbc,
        } => {
            let (stack_size, errfunc) = (*n, *errfunc);
            ThreadHeader::Suspended {
                stack: stack_size,
                errfunc,
            }
            .encode(w);
            stack.iter().for_each(|v| put(w, v));
            CallFrame::encode_count(w, *nci);
            for f in frames {
                f.frame.encode(w);
                match &f.k {
                    None => w.tag(Tag::Nil),
                    Some(k) => put(w, k),
                }
            }
            PendingCloses::encode(w, tbc.iter().copied());
        }
        _ => {}
    }
}

/// A permanent by name.
pub fn perm(name: &str) -> Node {
    Node::Perm(Box::new(Node::Str(name.as_bytes().to_vec())))
}

/// A string value.
pub fn str(s: &str) -> Node {
    Node::Str(s.as_bytes().to_vec())
}

/// A table with string keys and no metatable.
pub fn table(entries: Vec<(&str, Node)>) -> Node {
    Node::Table {
        narr: 0,
        nhash: entries.len() as u64,
        meta: Box::new(Node::Nil),
        entries: entries.into_iter().map(|(k, v)| (str(k), v)).collect(),
    }
}

/// Calls `f` on every node, parents before children.
pub fn walk_mut(node: &mut Node, f: &mut dyn FnMut(&mut Node)) {
    f(node);
    match node {
        Node::Perm(k) | Node::Thunk(k) | Node::Ident(_, k) | Node::Final(_, k) => walk_mut(k, f),
        Node::TwoPhase(a, b) => {
            walk_mut(a, f);
            walk_mut(b, f);
        }
        Node::Pending { root, list, .. } => {
            walk_mut(root, f);
            list.iter_mut().for_each(|v| walk_mut(v, f));
        }
        Node::RemovedKeys { root, entries, .. } | Node::GameRemovedKeys { root, entries, .. } => {
            walk_mut(root, f);
            entries.iter_mut().for_each(|e| walk_mut(&mut e.3, f));
        }
        Node::Table { meta, entries, .. } => {
            walk_mut(meta, f);
            for (k, v) in entries {
                walk_mut(k, f);
                walk_mut(v, f);
            }
        }
        Node::LClosure { upvals, .. } => {
            for u in upvals {
                match u {
                    Upval::New(v) => walk_mut(v, f),
                    Upval::Open { thread, .. } => walk_mut(thread, f),
                    Upval::Ref { .. } => {}
                }
            }
        }
        Node::CClosure { name, upvals, .. } => {
            walk_mut(name, f);
            upvals.iter_mut().for_each(|v| walk_mut(v, f));
        }
        Node::UdBytes { meta, uvs, .. } => {
            walk_mut(meta, f);
            uvs.iter_mut().for_each(|v| walk_mut(v, f));
        }
        Node::ThreadNotStarted { stack, .. } => stack.iter_mut().for_each(|v| walk_mut(v, f)),
        Node::ThreadSuspended { stack, frames, .. } => {
            stack.iter_mut().for_each(|v| walk_mut(v, f));
            for fr in frames {
                if let Some(k) = &mut fr.k {
                    walk_mut(k, f);
                }
            }
        }
        _ => {}
    }
}

/// Lua 5.5's hash of a short string under the state's seed (`luaS_hash` in lstring.c): what
/// places it in tables, and what chained it in the string table before luasnap's patch 9.
pub fn lua_string_hash(s: &[u8], seed: u32) -> u32 {
    let mut h = seed ^ s.len() as u32;
    for &c in s.iter().rev() {
        h ^= (h << 5).wrapping_add(h >> 2).wrapping_add(c as u32);
    }
    h
}

/// The hash seed a save-game shows: that of the first table layout in `node` (a layout
/// starts with the seed of the VM that wrote it).
pub fn layout_seed(node: &Node) -> Option<u32> {
    let mut n = node.clone();
    let mut seed = None;
    walk_mut(&mut n, &mut |x| {
        if let (None, Node::Layout(blob)) = (seed, &*x) {
            seed = Reader::new(blob)
                .varint()
                .and_then(|v| u32::try_from(v).ok());
        }
    });
    seed
}

/// `n` distinct strings of `len` bytes (2 to 40) whose Lua hash under `seed` has the same
/// low `bits` bits (at least 8): strings chosen to collide in a VM with that seed. The first
/// byte (hashed last) fixes the low 8 bits; the others are drawn from `rng_seed` until the
/// bits above match, about 2^(bits - 8) draws per string.
pub fn colliding_strings(
    seed: u32,
    bits: u32,
    n: usize,
    len: usize,
    rng_seed: u64,
) -> Vec<Vec<u8>> {
    assert!((8..=32).contains(&bits) && (2..=40).contains(&len));
    let mask = if bits == 32 {
        u32::MAX
    } else {
        (1u32 << bits) - 1
    };
    let target = 0x5a5a_5a5a & mask;
    let mut rng = rng_seed | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(n);
    let mut s = vec![0u8; len];
    while out.len() < n {
        for b in &mut s[1..] {
            *b = b'a' + (next() % 26) as u8;
        }
        // The hash before the first byte, then the byte that gives the low 8 bits.
        let mut h = seed ^ len as u32;
        for &c in s[1..].iter().rev() {
            h ^= (h << 5).wrapping_add(h >> 2).wrapping_add(c as u32);
        }
        let a = (h << 5).wrapping_add(h >> 2);
        s[0] = ((h ^ target) as u8).wrapping_sub(a as u8);
        if lua_string_hash(&s, seed) & mask == target && seen.insert(s.clone()) {
            out.push(s.clone());
        }
    }
    out
}

/// The body bytes of `depth` one-element tables nested in each other (`{ { ... { leaf } } }`),
/// written without recursion (a `Node` that deep would overflow the stack when encoded or
/// dropped): for `Node::Raw`.
pub fn nested_tables(depth: usize, leaf: i64) -> Vec<u8> {
    let mut w = Writer::default();
    for _ in 0..depth {
        w.tag(Tag::Table);
        w.varint(1);
        w.varint(0);
        w.tag(Tag::Nil); // no metatable
        w.tag(Tag::Int);
        w.i64(1);
    }
    w.tag(Tag::Int);
    w.i64(leaf);
    for _ in 0..depth {
        w.tag(Tag::Nil); // end of the entries
    }
    w.buf
}
