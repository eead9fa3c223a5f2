//! The save-game format, described once: the header, the tags, the records that follow them and
//! the order of the values after each record. The writer (`write/`), the loader (`read/`) and
//! the test forger (`forge.rs`) encode and decode through the types here, so a change to the
//! format is made here and the compiler (or a test) points at each use.
//!
//! ```text
//! header (50 bytes, little-endian; header.rs):
//!   magic        8   "LUASNAPS"
//!   format       u16 FORMAT_VERSION
//!   lua          u32 50501 (Lua 5.5.1: the exact release, since prototypes are matched structurally)
//!   int_size     u8  8      number formats of the writer
//!   num_size     u8  8
//!   int_check    i64 0x0102030405060708
//!   num_check    f64 -370.5
//!   flags        u8  bit 0: contains bytecode; bit 1: contains source text
//!   reserved     u8
//!   body_len     u64
//!   checksum     u64 XXH3-64 of the body
//! body: one value (the root), depth first; from format 9 on, a whole-game save whose VM had
//!   objects awaiting finalization that the root does not reach then has
//!   Pending (varint n > 0) value{n}  (each a new table or userdata, or a Ref);
//!   from format 10 on, the parts after the root are tagged (after.rs):
//!   (After::Pending Pending value{n})? (After::RemovedKeys RemovedKeys (RemovedKeyEntry key){n})?
//!   and from format 11 on (After::GameRemovedKeys RemovedKeys (GameRemovedKeyEntry key){n})?
//! ```
//!
//! Fields are varints (LEB128, at most ten bytes), zigzag varints for signed ones (`zz`), `u8`,
//! 8-byte little-endian `u64`, and `bytes` (a varint length, then the bytes); see `wire.rs`.
//! A value is a tag (`Tag`), then its record, then the values it contains:
//!
//! ```text
//! value     = Nil | False | True | Int zz | Float u64 (the bits) | Str bytes | Light u64
//!           | StrRef varint (string id) | Ref varint (object id)           -- Scalar
//!           | Perm value (the permanent's key, a primitive)
//!           | Table TableHeader value (metatable) (value value)* end      -- TablePart
//!           | LClosure ProtoRef varint (n) upvalue{n}                      -- Upvalues
//!           | CClosure value (the bare function's key) varint (n) value{n}
//!           | UdBytes UserdataBytes value (metatable) value{nuv}          -- UserdataParts
//!           | UdPlain PlainUserdata
//!           | Thunk value (rebuild) | TwoPhase value (create) value (init) -- SpecialParts
//!           | Thread ThreadHeader value{stack} [suspended: frames]        -- ThreadParts
//!           | MainThread
//!           | Ident varint object (format 7 on; object: a Table, LClosure, CClosure, UdBytes,
//!             UdPlain, Thunk, TwoPhase or Thread value, new)                   -- Ident
//!           | Final varint [Ident varint] (Table ... | UdBytes ...) (format 8 on: 0 not
//!             marked for finalization, n + 1 marked n-th)                      -- Final
//! end       = Nil | Layout bytes (a LayoutBlob: format 5 on)
//! upvalue   = UpvalNew value | UpvalRef UpvalueRef | UpvalOpen OpenUpvalue value (the coroutine)
//! ProtoRef  = varint (index) [first occurrence: ProtoRecord, or LegacyProto in formats 1-3]
//! ProtoRecord home 0:     Detached (short source, bytecode or empty)
//!             home c + 1: [first occurrence of chunk c: ChunkDef] ProtoPath
//!                         [format 6 on: ProtoNames (place) ProtoNames (upvalue names)]
//! frames    = varint (nframes) (CallFrame continuation){nframes} PendingCloses (format 4 on)
//! continuation = Nil | value (a permanent's name)
//! ```
//!
//! Every object gets the next id (0, 1, ...) at its first occurrence, in the same order when
//! writing and reading; later occurrences are `Ref(id)`. Strings are numbered apart: each `Str`
//! of at least [`min_strref_len`] bytes gets the next string id, and a later occurrence of the
//! same string is `StrRef(sid)`. That length is 1 from format 3 on (every string but the empty
//! one: a reference loads without hashing and interning the bytes again) and 4 in format 2;
//! format 1 files have no `StrRef` and read as format 2. Prototypes and chunks are numbered
//! likewise, each by its first occurrence. Format 4 brought chunk homes and pending
//! to-be-closed variables; formats 1 to 3 gave each new prototype its fingerprint, short source,
//! line and bytecode (`LegacyProto`). Format 5 brought table layouts. Format 6 brought each
//! chunk prototype's place (the names from its chunk's main prototype down, `persist::place`)
//! and its upvalues' names, with which a load binds a saved closure to the function at the
//! same place in a newer version of the chunk; files of formats 4 and 5 have none, and their
//! functions keep their saved code. Format 7 brought identities (`Ident`): each object that
//! was a table key in the saving VM carries the identity that decides its position in tables,
//! and a whole-game save's root carries the VM's key counter (`keys`: how many identities it
//! gave, past 2^31 - 1 too, where identities start again at 1), so a loaded game's
//! `pairs()` order over object keys, now and for keys made after the load, is the saving
//! process's. Files of format 6 and older have neither: a load gives objects new identities
//! from the loading VM's counter as they become keys, so their values load the same but
//! `pairs()` order over object keys may differ from the process that saved. Format 8 brought
//! finalization marks (`Final`): each table or userdata from bytes that the saving VM had
//! marked for finalization carries its place in the order of marking, and each one not marked
//! whose metatable has `__gc` says so, and a load marks exactly those (in that order) instead
//! of every object whose metatable has `__gc` when the load ends, as it does for files of
//! format 7 and older (so an object finalized already, or whose metatable got `__gc` after
//! `setmetatable`, is finalized after such a load though not in the saving VM). Format 9
//! brought the objects awaiting finalization (`Pending`): a whole-game save writes, after the
//! root, the objects the saving VM had marked for finalization that the root does not reach
//! (dropped since the last collection point, or separated and not yet finalized), so the
//! loaded game finalizes them where the saving process would; older files lose them. Format
//! 10 tags the parts after the root and adds removed keys (`RemovedKeys`: the keys a table
//! layout wrote as code 1, so that `next` finds a removed entry again by its key after a
//! load, as a coroutine suspended in a `pairs()` loop needs), and a whole-game root's layouts
//! of `_G` and `package.loaded` (`persist::game`).
//!
//! Each record's `encode` writes its tag (if it has one of its own) and its fields; its `decode`
//! reads the fields after the tag (the reader dispatches on the tag) in the same order, every
//! field attempted in turn, and returns the loader's message for what is wrong ([`Bad`]). A
//! varint that is not one leaves the reader where it starts, so a loader's error names that
//! byte: decoders keep the order in which the loader has always read fields, and stop where it
//! stops (a loader that acts between two fields, such as making the coroutine before its stack
//! size, decodes the record in the parts this file offers for it).

mod after;
mod header;
mod layout;
mod parts;
mod records;
mod tag;
mod value;
mod wire;

pub use after::{After, RemovedKeyEntry, RemovedKeys, REMOVED_KEYS_FORMAT};
pub use after::{GameRemovedKeyEntry, GameTable, GAME_REMOVED_KEYS_FORMAT};
pub use header::{
    check_head, min_strref_len, open, reseal, HeaderError, Opened, FLAG_BYTECODE,
    FLAG_QUOTED_PLACES, FLAG_SOURCE, FORMAT_VERSION, HEADER_LEN, LUA_RELEASE, MAGIC,
    MIN_STRREF_LEN, PENDING_FORMAT,
};
pub use layout::{layout_nodes, LayoutHeader, LayoutNode, RemovedKey, BAD_LAYOUT};
pub use parts::{SpecialPart, SpecialParts, TablePart, ThreadPart, ThreadParts, UserdataPart};
pub use parts::{Upvalues, UserdataParts};
pub use records::{
    CallFrame, ChunkDef, Detached, Final, Ident, LegacyProto, OpenUpvalue, Pending, PendingCloses,
    PlainUserdata, ProtoHome, ProtoNames, ProtoPath, ProtoRecord, TableHeader, ThreadHeader,
    UpvalueRef, UserdataBytes, IDENT_LIMIT, MAX_PATH, MAX_UPVALUE_NAMES,
};
pub use tag::Tag;
pub use value::Scalar;
pub use wire::{Bad, Reader, Writer};
