//! The save-game body as a tree: decoded from a file, edited, encoded again behind a valid
//! header. For hostile-file tests and the structure-aware fuzz target: a checksum is no
//! defence (anyone can recompute it), so the loader is attacked with files that are
//! well-formed in every respect but the one being forged.
//!
//! The tree mirrors the format (see `format.rs`) one to one, counts included: a count that
//! disagrees with the items that follow is written as is, so forged counts can be expressed.

use super::format::{Reader, Tag, Writer, THREAD_DEAD, THREAD_NOT_STARTED, THREAD_SUSPENDED};

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
    /// Bytes written as they are (anything the tree cannot say).
    Raw(Vec<u8>),
}

/// A closure's prototype: an index into those already listed, or a new one.
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

/// Where a prototype lives: chunk `chunk` (with its definition at its first occurrence) and
/// the path of child indices from the chunk's main prototype.
#[derive(Debug, Clone, PartialEq)]
pub struct Home {
    pub chunk: u64,
    pub def: Option<ChunkDef>,
    pub path: Vec<u64>,
}

/// A chunk's first occurrence: kind (0 source text, 1 binary), name, main fingerprint, code.
#[derive(Debug, Clone, PartialEq)]
pub struct ChunkDef {
    pub kind: u8,
    pub name: Vec<u8>,
    pub main_hash: u64,
    pub code: Vec<u8>,
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

/// A frame record of a suspended coroutine (see `CiRecord`).
#[derive(Debug, Clone, PartialEq)]
pub struct FrameRec {
    pub func: u64,
    pub top: u64,
    pub callstatus: u64,
    pub u2: i64,
    pub pc: u64,
    pub extra: u64,
    pub old_errfunc: i64,
    pub ctx: i64,
    /// The continuation: `None` (a `Nil` tag) or a permanent's name.
    pub k: Option<Node>,
}

const MAX_DEPTH: usize = 256;

/// Decodes a body (not a file: see `body_of`). `None` if it is malformed or nests deeper
/// than the decoder goes.
pub fn decode(body: &[u8]) -> Option<Node> {
    let mut d = Decoder {
        r: Reader::new(body),
        protos: 0,
        chunks: 0,
    };
    let n = d.node(0)?;
    (d.r.remaining() == 0).then_some(n)
}

struct Decoder<'a> {
    r: Reader<'a>,
    protos: u64,
    chunks: u64,
}

impl Decoder<'_> {
    fn list(&mut self, n: u64, depth: usize) -> Option<Vec<Node>> {
        if n > self.r.remaining() as u64 {
            return None;
        }
        (0..n).map(|_| self.node(depth + 1)).collect()
    }

    fn node(&mut self, depth: usize) -> Option<Node> {
        if depth > MAX_DEPTH {
            return None;
        }
        let r = &mut self.r;
        Some(match Tag::from_u8(r.u8()?)? {
            Tag::Nil => Node::Nil,
            Tag::Layout => Node::Layout(r.bytes()?.to_vec()),
            Tag::False => Node::False,
            Tag::True => Node::True,
            Tag::Int => Node::Int(r.i64()?),
            Tag::Float => Node::Float(r.u64()?),
            Tag::Str => Node::Str(r.bytes()?.to_vec()),
            Tag::Light => Node::Light(r.u64()?),
            Tag::StrRef => Node::StrRef(r.varint()?),
            Tag::Ref => Node::Ref(r.varint()?),
            Tag::Perm => Node::Perm(Box::new(self.node(depth + 1)?)),
            Tag::Table => {
                let (narr, nhash) = (r.varint()?, r.varint()?);
                let meta = Box::new(self.node(depth + 1)?);
                let mut entries = Vec::new();
                loop {
                    if self.r.data.get(self.r.pos) == Some(&(Tag::Nil as u8)) {
                        self.r.pos += 1;
                        break;
                    }
                    if self.r.data.get(self.r.pos) == Some(&(Tag::Layout as u8)) {
                        self.r.pos += 1;
                        let b = self.r.bytes()?.to_vec();
                        entries.push((Node::Layout(b), Node::Nil));
                        break;
                    }
                    let k = self.node(depth + 1)?;
                    let v = self.node(depth + 1)?;
                    entries.push((k, v));
                }
                Node::Table {
                    narr,
                    nhash,
                    meta,
                    entries,
                }
            }
            Tag::LClosure => {
                let index = r.varint()?;
                let proto = if index == self.protos {
                    self.protos += 1;
                    let (hash, line, home) = (r.u64()?, r.varint()?, r.varint()?);
                    if home == 0 {
                        Proto::New {
                            index,
                            hash,
                            src: r.bytes()?.to_vec(),
                            line,
                            code: r.bytes()?.to_vec(),
                            home: None,
                        }
                    } else {
                        let chunk = home - 1;
                        let def = if chunk == self.chunks {
                            self.chunks += 1;
                            Some(ChunkDef {
                                kind: r.u8()?,
                                name: r.bytes()?.to_vec(),
                                main_hash: r.u64()?,
                                code: r.bytes()?.to_vec(),
                            })
                        } else {
                            None
                        };
                        let depth = r.varint()?;
                        if depth > r.remaining() as u64 {
                            return None;
                        }
                        let path = (0..depth).map(|_| r.varint()).collect::<Option<Vec<_>>>()?;
                        Proto::New {
                            index,
                            hash,
                            src: Vec::new(),
                            line,
                            code: Vec::new(),
                            home: Some(Home { chunk, def, path }),
                        }
                    }
                } else {
                    Proto::Index(index)
                };
                let n = self.r.varint()?;
                if n > self.r.remaining() as u64 {
                    return None;
                }
                let mut upvals = Vec::new();
                for _ in 0..n {
                    upvals.push(match Tag::from_u8(self.r.u8()?)? {
                        Tag::UpvalNew => Upval::New(self.node(depth + 1)?),
                        Tag::UpvalRef => Upval::Ref {
                            closure: self.r.varint()?,
                            index: self.r.varint()?,
                        },
                        Tag::UpvalOpen => Upval::Open {
                            level: self.r.varint()?,
                            thread: self.node(depth + 1)?,
                        },
                        _ => return None,
                    });
                }
                Node::LClosure { proto, n, upvals }
            }
            Tag::CClosure => {
                let name = Box::new(self.node(depth + 1)?);
                let n = self.r.varint()?;
                let upvals = self.list(n, depth)?;
                Node::CClosure { name, n, upvals }
            }
            Tag::UdBytes => {
                let bytes = r.bytes()?.to_vec();
                let nuv = r.varint()?;
                let meta = Box::new(self.node(depth + 1)?);
                let uvs = self.list(nuv, depth)?;
                Node::UdBytes {
                    bytes,
                    nuv,
                    meta,
                    uvs,
                }
            }
            Tag::UdPlain => Node::UdPlain {
                name: r.bytes()?.to_vec(),
                bytes: r.bytes()?.to_vec(),
            },
            Tag::Thunk => Node::Thunk(Box::new(self.node(depth + 1)?)),
            Tag::TwoPhase => {
                let a = self.node(depth + 1)?;
                Node::TwoPhase(Box::new(a), Box::new(self.node(depth + 1)?))
            }
            Tag::Thread => match r.u8()? {
                THREAD_DEAD => Node::ThreadDead,
                THREAD_NOT_STARTED => {
                    let n = r.varint()?;
                    let stack = self.list(n, depth)?;
                    Node::ThreadNotStarted { n, stack }
                }
                THREAD_SUSPENDED => {
                    let n = r.varint()?;
                    let errfunc = r.i64()?;
                    let stack = self.list(n, depth)?;
                    let nci = self.r.varint()?;
                    if nci > self.r.remaining() as u64 {
                        return None;
                    }
                    let mut frames = Vec::new();
                    for _ in 0..nci {
                        let r = &mut self.r;
                        let mut f = FrameRec {
                            func: r.varint()?,
                            top: r.varint()?,
                            callstatus: r.varint()?,
                            u2: r.i64()?,
                            pc: r.varint()?,
                            extra: r.varint()?,
                            old_errfunc: r.i64()?,
                            ctx: r.i64()?,
                            k: None,
                        };
                        if self.r.data.get(self.r.pos) == Some(&(Tag::Nil as u8)) {
                            self.r.pos += 1;
                        } else {
                            f.k = Some(self.node(depth + 1)?);
                        }
                        frames.push(f);
                    }
                    let ntbc = self.r.varint()?;
                    if ntbc > self.r.remaining() as u64 {
                        return None;
                    }
                    let tbc = (0..ntbc)
                        .map(|_| self.r.varint())
                        .collect::<Option<Vec<_>>>()?;
                    Node::ThreadSuspended {
                        n,
                        errfunc,
                        stack,
                        nci,
                        frames,
                        tbc,
                    }
                }
                _ => return None,
            },
            Tag::MainThread => Node::MainThread,
            Tag::UpvalNew | Tag::UpvalRef | Tag::UpvalOpen => return None,
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
    super::seal_body(&encode(node), true)
}

fn put(w: &mut Writer, node: &Node) {
    match node {
        Node::Nil => w.tag(Tag::Nil),
        Node::Layout(b) => {
            w.tag(Tag::Layout);
            w.bytes(b);
        }
        Node::False => w.tag(Tag::False),
        Node::True => w.tag(Tag::True),
        Node::Int(v) => {
            w.tag(Tag::Int);
            w.i64(*v);
        }
        Node::Float(b) => {
            w.tag(Tag::Float);
            w.u64(*b);
        }
        Node::Str(b) => {
            w.tag(Tag::Str);
            w.bytes(b);
        }
        Node::Light(v) => {
            w.tag(Tag::Light);
            w.u64(*v);
        }
        Node::StrRef(v) => {
            w.tag(Tag::StrRef);
            w.varint(*v);
        }
        Node::Ref(v) => {
            w.tag(Tag::Ref);
            w.varint(*v);
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
            w.tag(Tag::Table);
            w.varint(*narr);
            w.varint(*nhash);
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
            match proto {
                Proto::Index(i) => w.varint(*i),
                Proto::New {
                    index,
                    hash,
                    src,
                    line,
                    code,
                    home,
                } => {
                    w.varint(*index);
                    w.u64(*hash);
                    w.varint(*line);
                    match home {
                        None => {
                            w.varint(0);
                            w.bytes(src);
                            w.bytes(code);
                        }
                        Some(h) => {
                            w.varint(h.chunk + 1);
                            if let Some(d) = &h.def {
                                w.u8(d.kind);
                                w.bytes(&d.name);
                                w.u64(d.main_hash);
                                w.bytes(&d.code);
                            }
                            w.varint(h.path.len() as u64);
                            for &i in &h.path {
                                w.varint(i);
                            }
                        }
                    }
                }
            }
            w.varint(*n);
            for u in upvals {
                match u {
                    Upval::New(v) => {
                        w.tag(Tag::UpvalNew);
                        put(w, v);
                    }
                    Upval::Ref { closure, index } => {
                        w.tag(Tag::UpvalRef);
                        w.varint(*closure);
                        w.varint(*index);
                    }
                    Upval::Open { level, thread } => {
                        w.tag(Tag::UpvalOpen);
                        w.varint(*level);
                        put(w, thread);
                    }
                }
            }
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
            w.tag(Tag::UdBytes);
            w.bytes(bytes);
            w.varint(*nuv);
            put(w, meta);
            uvs.iter().for_each(|v| put(w, v));
        }
        Node::UdPlain { name, bytes } => {
            w.tag(Tag::UdPlain);
            w.bytes(name);
            w.bytes(bytes);
        }
        Node::Thunk(f) => {
            w.tag(Tag::Thunk);
            put(w, f);
        }
        Node::TwoPhase(a, b) => {
            w.tag(Tag::TwoPhase);
            put(w, a);
            put(w, b);
        }
        Node::ThreadDead => {
            w.tag(Tag::Thread);
            w.u8(THREAD_DEAD);
        }
        Node::ThreadNotStarted { n, stack } => {
            w.tag(Tag::Thread);
            w.u8(THREAD_NOT_STARTED);
            w.varint(*n);
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
            w.tag(Tag::Thread);
            w.u8(THREAD_SUSPENDED);
            w.varint(*n);
            w.i64(*errfunc);
            stack.iter().for_each(|v| put(w, v));
            w.varint(*nci);
            for f in frames {
                w.varint(f.func);
                w.varint(f.top);
                w.varint(f.callstatus);
                w.i64(f.u2);
                w.varint(f.pc);
                w.varint(f.extra);
                w.i64(f.old_errfunc);
                w.i64(f.ctx);
                match &f.k {
                    None => w.tag(Tag::Nil),
                    Some(k) => put(w, k),
                }
            }
            w.varint(tbc.len() as u64);
            for &t in tbc {
                w.varint(t);
            }
        }
        Node::MainThread => w.tag(Tag::MainThread),
        Node::Raw(b) => w.buf.extend_from_slice(b),
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
        Node::Perm(k) | Node::Thunk(k) => walk_mut(k, f),
        Node::TwoPhase(a, b) => {
            walk_mut(a, f);
            walk_mut(b, f);
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
