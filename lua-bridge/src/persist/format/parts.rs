//! The order of the values that follow an object's record: its parts, which the writer's
//! frames write and the loader's frames read in this order. Each cursor says which part comes
//! next (`peek`) and moves on (`next`); both sides keep one in the frame of an object whose
//! contents are being written or read.

/// The values after a table's header: its metatable, then for each entry its key and its
/// value, until `Nil` or `Tag::Layout` where a key would be (its end marker).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TablePart {
    Metatable,
    /// An entry's key, or the end marker.
    Key,
    /// The value of the entry whose key came last.
    Value,
}

impl TablePart {
    /// The part after this one.
    #[inline(always)]
    pub fn after(self) -> TablePart {
        match self {
            TablePart::Metatable | TablePart::Value => TablePart::Key,
            TablePart::Key => TablePart::Value,
        }
    }
}

/// A part of a userdata written by bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UserdataPart {
    Metatable,
    /// User value `i` (1-based).
    UserValue(u32),
}

/// The values after a userdata's bytes: its metatable, then user values 1..=nuv.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UserdataParts {
    /// 0: the metatable; else the user value.
    next: u32,
    nuv: u32,
}

impl UserdataParts {
    pub fn new(nuv: u32) -> Self {
        UserdataParts { next: 0, nuv }
    }

    /// The part that comes next, or None after the last.
    pub fn peek(&self) -> Option<UserdataPart> {
        match self.next {
            0 => Some(UserdataPart::Metatable),
            i if i <= self.nuv => Some(UserdataPart::UserValue(i)),
            _ => None,
        }
    }
}

impl Iterator for UserdataParts {
    type Item = UserdataPart;

    fn next(&mut self) -> Option<UserdataPart> {
        let part = self.peek()?;
        self.next += 1;
        Some(part)
    }
}

/// A function written for an object rebuilt by its `__persist` function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecialPart {
    /// After `Tag::Thunk`: the rebuild function (it returns the object).
    Rebuild,
    /// After `Tag::TwoPhase`: the create function (it returns the object)...
    Create,
    /// ... then the init function (called with the object once the whole file is loaded).
    Init,
}

/// The values after `Tag::Thunk` (the rebuild function) or `Tag::TwoPhase` (create, then
/// init).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecialParts {
    next: Option<SpecialPart>,
}

impl SpecialParts {
    pub fn new(two_phase: bool) -> Self {
        let first = if two_phase {
            SpecialPart::Create
        } else {
            SpecialPart::Rebuild
        };
        SpecialParts { next: Some(first) }
    }

    /// The part that comes next, or None after the last.
    pub fn peek(&self) -> Option<SpecialPart> {
        self.next
    }
}

impl Iterator for SpecialParts {
    type Item = SpecialPart;

    fn next(&mut self) -> Option<SpecialPart> {
        let part = self.next?;
        self.next = (part == SpecialPart::Create).then_some(SpecialPart::Init);
        Some(part)
    }
}

/// A part of a coroutine after its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadPart {
    /// Stack slot `i` (1-based).
    Slot(u32),
    /// The call frames and pending to-be-closed variables (of a suspended coroutine: nothing
    /// for one not started), after the stack values they refer to; then the coroutine ends.
    CallFrames,
}

/// The values after a live coroutine's header: stack slots 1..=n, then its call frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadParts {
    next: u32,
    n: u32,
}

impl ThreadParts {
    pub fn new(n: u32) -> Self {
        ThreadParts { next: 1, n }
    }

    /// The part that comes next: each slot in turn, then (and from then on) the call frames.
    pub fn peek(&self) -> ThreadPart {
        if self.next > self.n {
            ThreadPart::CallFrames
        } else {
            ThreadPart::Slot(self.next)
        }
    }

    /// The part that comes next, moving on.
    pub fn next_part(&mut self) -> ThreadPart {
        let part = self.peek();
        if let ThreadPart::Slot(_) = part {
            self.next += 1;
        }
        part
    }
}

/// The upvalues of a closure: 1..=n, each an upvalue record (a Lua closure's) or a value (a C
/// closure's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Upvalues {
    next: u32,
    n: u32,
}

impl Upvalues {
    pub fn new(n: u32) -> Self {
        Upvalues { next: 1, n }
    }

    /// The number of the upvalue that comes next, or None after the last.
    pub fn peek(&self) -> Option<u32> {
        (self.next <= self.n).then_some(self.next)
    }
}

impl Iterator for Upvalues {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        let i = self.peek()?;
        self.next += 1;
        Some(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cursor_gives_its_parts_in_order_then_ends() {
        let mut u = UserdataParts::new(2);
        let order: Vec<_> = u.by_ref().collect();
        assert_eq!(
            order,
            [
                UserdataPart::Metatable,
                UserdataPart::UserValue(1),
                UserdataPart::UserValue(2)
            ]
        );
        assert_eq!(
            (u.peek(), u.next()),
            (None, None),
            "an ended cursor stays ended"
        );
        assert_eq!(UserdataParts::new(0).count(), 1, "the metatable alone");

        let two: Vec<_> = SpecialParts::new(true).collect();
        assert_eq!(two, [SpecialPart::Create, SpecialPart::Init]);
        let one: Vec<_> = SpecialParts::new(false).collect();
        assert_eq!(one, [SpecialPart::Rebuild]);

        let mut t = ThreadParts::new(2);
        let order: Vec<_> = (0..4).map(|_| t.next_part()).collect();
        assert_eq!(
            order,
            [
                ThreadPart::Slot(1),
                ThreadPart::Slot(2),
                ThreadPart::CallFrames,
                ThreadPart::CallFrames
            ]
        );
        assert_eq!(ThreadParts::new(0).peek(), ThreadPart::CallFrames);

        assert_eq!(Upvalues::new(3).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(Upvalues::new(0).peek(), None);

        let mut p = TablePart::Metatable;
        let order: Vec<_> = (0..4)
            .map(|_| {
                p = p.after();
                p
            })
            .collect();
        assert_eq!(
            order,
            [
                TablePart::Key,
                TablePart::Value,
                TablePart::Key,
                TablePart::Value
            ]
        );
    }
}
