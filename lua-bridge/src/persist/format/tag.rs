//! The value tags: the first byte of every value (and of every upvalue of a Lua closure).

/// Value tags: the first byte of every value (and of every upvalue of a Lua closure).
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tag {
    Nil = 0,
    False = 1,
    True = 2,
    Int = 3,
    Float = 4,
    Str = 5,
    Light = 6,
    StrRef = 7,
    Ref = 10,
    Perm = 11,
    Table = 20,
    LClosure = 21,
    CClosure = 22,
    UdBytes = 23,
    UdPlain = 24,
    Thunk = 25,
    TwoPhase = 26,
    /// Ends a table's entries like `Nil`, followed by the layout of its hash part (bytes).
    Layout = 27,
    /// Format 7 on: the new object whose tag follows has this identity as a table key
    /// ([`Ident`](super::Ident)).
    Ident = 28,
    Thread = 29,
    /// Format 8 on: the new table or userdata that follows is, or is not, marked for
    /// finalization ([`Final`](super::Final)).
    Final = 30,
    MainThread = 32,
    UpvalNew = 40,
    UpvalRef = 41,
    UpvalOpen = 42,
}

impl Tag {
    pub fn from_u8(b: u8) -> Option<Tag> {
        use Tag::*;
        Some(match b {
            0 => Nil,
            1 => False,
            2 => True,
            3 => Int,
            4 => Float,
            5 => Str,
            6 => Light,
            7 => StrRef,
            10 => Ref,
            11 => Perm,
            20 => Table,
            21 => LClosure,
            22 => CClosure,
            23 => UdBytes,
            24 => UdPlain,
            25 => Thunk,
            26 => TwoPhase,
            27 => Layout,
            28 => Ident,
            29 => Thread,
            30 => Final,
            32 => MainThread,
            40 => UpvalNew,
            41 => UpvalRef,
            42 => UpvalOpen,
            _ => return None,
        })
    }
}
