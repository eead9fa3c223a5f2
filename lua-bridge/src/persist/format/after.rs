//! What follows the root (format 10 on): parts, each starting with its tag ([`After`]), in
//! the order of their tags and each at most once. Files of format 9 have at most the objects
//! awaiting finalization there, untagged.
//!
//! ```text
//! after      = (After::Pending Pending value{n})? (After::RemovedKeys RemovedKeys entry{n})?
//!              (After::GameRemovedKeys RemovedKeys game_entry{n})?        (format 11 on)
//! entry      = RemovedKeyEntry key
//! game_entry = GameRemovedKeyEntry key
//! key        = Ref varint | StrRef varint | Perm value      (nothing new: a reference or a name)
//! ```

use super::wire::{Bad, Reader, Writer};

/// The tag of a part after the root.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum After {
    /// The objects awaiting finalization that the root does not reach ([`Pending`](super::Pending)).
    Pending = 1,
    /// The keys of removed entries a table layout wrote without them ([`RemovedKeys`]).
    RemovedKeys = 2,
    /// The same for the loading VM's own `_G` and `package.loaded`, whose layouts a
    /// whole-game save's root carries ([`GameRemovedKeyEntry`], format 11 on).
    GameRemovedKeys = 3,
}

impl After {
    pub fn from_u8(b: u8) -> Option<After> {
        match b {
            1 => Some(After::Pending),
            2 => Some(After::RemovedKeys),
            3 => Some(After::GameRemovedKeys),
            _ => None,
        }
    }
}

/// The first format whose parts after the root are tagged and may hold removed keys.
pub const REMOVED_KEYS_FORMAT: u16 = 10;

/// The first format that may carry [`After::GameRemovedKeys`].
pub const GAME_REMOVED_KEYS_FORMAT: u16 = 11;

/// After `After::RemovedKeys`: how many entries follow (n > 0). A table layout writes a removed
/// entry whose key is an object, a light C function or a string a collection cleared as code 1,
/// without the key (the object may be written after the table, or not at all); Lua finds
/// such an entry again only by that key, which a coroutine suspended in a `pairs()` loop that
/// cleared it holds (`next(t, k)` resumes after the node whose key is k). Each entry gives one
/// such node its key back: a reference to an object or string written in the file, or a
/// permanent's name. Keys nothing written reaches stay without one (nothing can look them up).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemovedKeys(pub u64);

impl RemovedKeys {
    /// The fewest bytes an entry takes (three varints and a key's tag and id).
    const MIN_ENTRY: u64 = 5;

    pub fn encode(&self, w: &mut Writer) {
        w.varint(self.0);
    }

    /// Reads the count: at most one entry per [`Self::MIN_ENTRY`] bytes left.
    pub fn decode(r: &mut Reader<'_>) -> Result<Self, Bad> {
        match r.varint() {
            Some(n) if n > 0 && n <= r.remaining() as u64 / Self::MIN_ENTRY => Ok(RemovedKeys(n)),
            Some(0) => Err("an empty list of removed keys"),
            _ => Err("a count of removed keys larger than the file"),
        }
    }
}

/// One entry of [`RemovedKeys`], before its key: the table (an object id), the node (an index
/// below its node count, checked by the loader against the table) and whether the key was
/// dead (cleared by a collection: it stays an identity only) or still the entry's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemovedKeyEntry {
    pub table: u32,
    pub node: u32,
    pub dead: bool,
}

impl RemovedKeyEntry {
    pub fn encode(&self, w: &mut Writer) {
        w.varint(self.table as u64);
        w.varint(self.node as u64);
        w.varint(self.dead as u64);
    }

    pub fn decode(r: &mut Reader<'_>) -> Result<Self, Bad> {
        let bad = "a removed key's entry that is not one";
        let table = r.varint().filter(|&v| v <= u32::MAX as u64).ok_or(bad)?;
        let node = r.varint().filter(|&v| v < 1 << 30).ok_or(bad)?;
        let dead = match r.varint().ok_or(bad)? {
            0 => false,
            1 => true,
            _ => return Err(bad),
        };
        Ok(RemovedKeyEntry {
            table: table as u32,
            node: node as u32,
            dead,
        })
    }
}

/// Which of the loading VM's own tables a [`GameRemovedKeyEntry`] names: a whole-game load
/// sets the saved globals and modules into them, so they are no objects of the file and have
/// no object id.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GameTable {
    /// `_G` (the root's `globals_layout`).
    Globals = 0,
    /// `package.loaded` (the root's `loaded_layout`).
    Loaded = 1,
}

/// One entry of [`After::GameRemovedKeys`] (its count is a [`RemovedKeys`]), before its key:
/// as [`RemovedKeyEntry`], with the table one of the loading VM's own ([`GameTable`]) and the
/// node an index into the layout the root carries for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GameRemovedKeyEntry {
    pub table: GameTable,
    pub node: u32,
    pub dead: bool,
}

impl GameRemovedKeyEntry {
    pub fn encode(&self, w: &mut Writer) {
        RemovedKeyEntry {
            table: self.table as u32,
            node: self.node,
            dead: self.dead,
        }
        .encode(w);
    }

    pub fn decode(r: &mut Reader<'_>) -> Result<Self, Bad> {
        let e = RemovedKeyEntry::decode(r)?;
        let table = match e.table {
            0 => GameTable::Globals,
            1 => GameTable::Loaded,
            _ => return Err("a removed key of a game table that is neither _G nor package.loaded"),
        };
        Ok(GameRemovedKeyEntry {
            table,
            node: e.node,
            dead: e.dead,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_and_counts_round_trip_and_refuse_what_is_not_one() {
        let e = RemovedKeyEntry {
            table: 7,
            node: 300,
            dead: true,
        };
        let mut w = Writer::default();
        e.encode(&mut w);
        assert_eq!(RemovedKeyEntry::decode(&mut Reader::new(&w.buf)), Ok(e));
        let mut w = Writer::default();
        w.varint(7);
        w.varint(3);
        w.varint(2); // neither dead nor not
        assert!(RemovedKeyEntry::decode(&mut Reader::new(&w.buf)).is_err());
        let mut w = Writer::default();
        RemovedKeys(2).encode(&mut w);
        w.buf.extend_from_slice(&[0; 10]);
        assert_eq!(
            RemovedKeys::decode(&mut Reader::new(&w.buf)),
            Ok(RemovedKeys(2))
        );
        let mut w = Writer::default();
        RemovedKeys(3).encode(&mut w);
        w.buf.extend_from_slice(&[0; 14]);
        assert!(
            RemovedKeys::decode(&mut Reader::new(&w.buf)).is_err(),
            "3 entries in 14 bytes"
        );
        assert_eq!(After::from_u8(2), Some(After::RemovedKeys));
        assert_eq!(After::from_u8(3), Some(After::GameRemovedKeys));
        assert_eq!(After::from_u8(4), None);
        assert!(After::Pending < After::RemovedKeys);
        assert!(After::RemovedKeys < After::GameRemovedKeys);
    }

    #[test]
    fn game_entries_name_only_globals_or_loaded() {
        for table in [GameTable::Globals, GameTable::Loaded] {
            let e = GameRemovedKeyEntry {
                table,
                node: 5,
                dead: false,
            };
            let mut w = Writer::default();
            e.encode(&mut w);
            assert_eq!(GameRemovedKeyEntry::decode(&mut Reader::new(&w.buf)), Ok(e));
        }
        let mut w = Writer::default();
        RemovedKeyEntry {
            table: 2,
            node: 0,
            dead: true,
        }
        .encode(&mut w);
        assert!(GameRemovedKeyEntry::decode(&mut Reader::new(&w.buf)).is_err());
    }
}
