//! Reading a save-game file: its header is checked before its body is read, so a file that is
//! no save-game, one whose length disagrees with its header, or one whose body is larger than
//! the command will load is refused without reading it (a 3 GB sparse file was read whole, 3.1
//! GB of memory, before its first 8 bytes were checked). The body is read through a bound, so a
//! file that grows or a device (`/dev/zero`) cannot make a read endless.

use luasnap::bridge::persist::{declared_body_len, HEADER_LEN, MAGIC};
use std::io::Read;
use std::path::Path;

/// How a command takes a save-game's body.
#[derive(Debug, Clone, Copy)]
pub enum Body {
    /// To load it: the file must be exactly as long as its header says, and the body at most
    /// `max` bytes, the limit the command's option `flag` sets (a body larger than the arena or
    /// the memory a load may use cannot load).
    Load { max: u64, flag: &'static str },
    /// To seal it again after an edit (`luasnap reseal`): the body may be longer or shorter
    /// than the header says, by at most [`RESEAL_SLACK`] bytes more.
    Edited,
}

/// How many bytes an edited save's body may have beyond what its header says, for `reseal`.
pub const RESEAL_SLACK: u64 = 256 << 20;

/// Reads the save-game at `path` as `body` says, or says why not and what to do.
pub fn read_save(path: &Path, body: Body) -> Result<Vec<u8>, String> {
    let shown = path.display();
    let cannot = |e: std::io::Error| format!("cannot read save-game {shown}: {e}");
    let mut file = std::fs::File::open(path).map_err(cannot)?;
    let mut head = Vec::with_capacity(HEADER_LEN);
    (&mut file)
        .take(HEADER_LEN as u64)
        .read_to_end(&mut head)
        .map_err(cannot)?;
    if !head.starts_with(MAGIC) {
        return Err(format!(
            "{shown} is not a luasnap save-game (it does not start with {:?}); give a file written by `luasnap simulate --save` or Vm::save_game",
            String::from_utf8_lossy(MAGIC)
        ));
    }
    let declared = declared_body_len(&head).map_err(|e| format!("{shown}: {e}"))?;
    let most = match body {
        Body::Load { max, flag } => {
            if declared > max {
                return Err(format!(
                    "{shown}: its header says the body has {declared} bytes, more than a load may take here ({max} bytes, {flag}): raise {flag} if the file is genuine"
                ));
            }
            declared
        }
        Body::Edited => declared.saturating_add(RESEAL_SLACK),
    };
    // One byte more than allowed tells a longer file from one of the allowed length.
    let mut bytes = head;
    bytes.reserve(most.min(1 << 30) as usize);
    (&mut file)
        .take(most.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(cannot)?;
    let actual = (bytes.len() - HEADER_LEN) as u64;
    match body {
        Body::Load { .. } if actual != declared => Err(format!(
            "{shown}: its header says the body has {declared} bytes, the file has {}: the file was cut short or damaged, or edited by hand (`luasnap reseal {shown}` seals an edited file again)",
            if actual > declared {
                "more".to_string()
            } else {
                actual.to_string()
            }
        )),
        Body::Edited if actual > most => Err(format!(
            "{shown}: the body is more than {RESEAL_SLACK} bytes longer than its header says ({declared} bytes): reseal takes edits that add at most that much"
        )),
        _ => Ok(bytes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file of `body_len` zero bytes behind a valid header that declares `declared`.
    fn save_with(dir: &Path, declared: u64, body_len: usize) -> std::path::PathBuf {
        let vm = luasnap::bridge::Vm::builder()
            .capacity(64 << 20)
            .build()
            .unwrap();
        let real = vm.save_game().unwrap();
        let mut bytes = real[..HEADER_LEN].to_vec();
        bytes[34..42].copy_from_slice(&declared.to_le_bytes());
        bytes.resize(HEADER_LEN + body_len, 0);
        let path = dir.join(format!("s-{declared}-{body_len}.sav"));
        std::fs::write(&path, bytes).unwrap();
        path
    }

    #[test]
    fn a_body_longer_or_shorter_than_the_header_says_is_refused_without_reading_it_all() {
        let dir = tempfile::tempdir().unwrap();
        let load = Body::Load {
            max: 1 << 20,
            flag: "--memory-limit",
        };
        let longer = save_with(dir.path(), 10, 4096);
        let err = read_save(&longer, load).unwrap_err();
        assert!(
            err.contains("says the body has 10 bytes, the file has more"),
            "{err}"
        );
        let shorter = save_with(dir.path(), 100, 10);
        let err = read_save(&shorter, load).unwrap_err();
        assert!(err.contains("the file has 10"), "{err}");
        assert!(err.contains("luasnap reseal"), "{err}");
        let huge = save_with(dir.path(), 1 << 40, 0);
        let err = read_save(&huge, load).unwrap_err();
        assert!(err.contains("raise --memory-limit"), "{err}");
        // reseal takes a length that differs, within its slack.
        assert_eq!(
            read_save(&longer, Body::Edited).unwrap().len(),
            HEADER_LEN + 4096
        );
        assert_eq!(
            read_save(&shorter, Body::Edited).unwrap().len(),
            HEADER_LEN + 10
        );
    }

    #[test]
    fn no_save_game_and_devices_are_refused_by_their_first_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("text.sav");
        std::fs::write(&text, "hello, this is no save").unwrap();
        let err = read_save(&text, Body::Edited).unwrap_err();
        assert!(err.contains("is not a luasnap save-game"), "{err}");
        // An endless device is refused at its first bytes, not read forever.
        let err = read_save(Path::new("/dev/zero"), Body::Edited).unwrap_err();
        assert!(err.contains("is not a luasnap save-game"), "{err}");
        let err = read_save(dir.path(), Body::Edited).unwrap_err();
        assert!(err.contains("cannot read save-game"), "{err}");
    }
}
