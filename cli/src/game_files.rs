//! The game's files as this process read them, handed to the second processes it starts
//! (`simulate`'s second run of the reference, `p2p`'s second peer and its replays), so that
//! every process runs the very bytes this one read once ([`GameConfig::read_folder`]), not
//! the folder as it is when a second process starts or requires a module: a module edited
//! during a run can no longer make the two processes run different code.
//!
//! The file is this tool's own, written and read by the same binary, in the system's
//! temporary folder (readable by this user only) and removed when the run ends: fields
//! prefixed with their length, after a line naming the format.

use luasnap::bridge::runtime::GameConfig;
use luasnap::bridge::Module;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

/// The first bytes of the file: what it is, and the version of its layout.
const MAGIC: &[u8] = b"luasnap game files 1\n";

/// Writes the game of `cfg` (its main script and the folder's files it read) to a fresh
/// file for a second process ([`read`]); the file is removed when the returned path drops.
/// `cfg`'s folder must have been read ([`GameConfig::read_folder`]).
pub(crate) fn write(cfg: &GameConfig) -> Result<tempfile::TempPath, String> {
    let mut out = MAGIC.to_vec();
    let mut field = |b: &[u8]| {
        out.extend_from_slice(&(b.len() as u64).to_le_bytes());
        out.extend_from_slice(b);
    };
    field(cfg.chunk_name.as_bytes());
    field(cfg.script.as_bytes());
    field(
        cfg.folder
            .as_deref()
            .map_or(&[][..], |f| f.as_os_str().as_bytes()),
    );
    let files = cfg.folder_files.as_deref().unwrap_or(&[]);
    field(&(files.len() as u64).to_le_bytes());
    for m in files {
        field(m.name.as_bytes());
        field(m.path.as_bytes());
        field(&m.source);
    }
    let path = crate::scratch_file("game-", ".files")?;
    std::fs::write(&path, &out)
        .map_err(|e| format!("cannot write the game's files to {}: {e}", path.display()))?;
    Ok(path)
}

/// `cfg` with the game [`write`] wrote to `path`: no file of the game's folder is read.
pub(crate) fn read(path: &Path, mut cfg: GameConfig) -> Result<GameConfig, String> {
    let bad = |what: &str| format!("{} is not a game's files ({what})", path.display());
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut rest = bytes.strip_prefix(MAGIC).ok_or_else(|| bad("header"))?;
    let mut field = || -> Result<Vec<u8>, String> {
        let (len, tail) = rest.split_first_chunk::<8>().ok_or_else(|| bad("length"))?;
        let len = usize::try_from(u64::from_le_bytes(*len)).map_err(|_| bad("length"))?;
        if len > tail.len() {
            return Err(bad("cut short"));
        }
        let (value, tail) = tail.split_at(len);
        rest = tail;
        Ok(value.to_vec())
    };
    let text = |b: Vec<u8>| String::from_utf8(b).map_err(|_| bad("text"));
    cfg.chunk_name = text(field()?)?;
    cfg.script = text(field()?)?;
    let folder = field()?;
    cfg.folder = (!folder.is_empty()).then(|| PathBuf::from(std::ffi::OsString::from_vec(folder)));
    let count: [u8; 8] = field()?.try_into().map_err(|_| bad("count"))?;
    let mut files = Vec::new();
    for _ in 0..u64::from_le_bytes(count) {
        files.push(Module {
            name: text(field()?)?,
            path: text(field()?)?,
            source: field()?,
        });
    }
    if !rest.is_empty() {
        return Err(bad("trailing bytes"));
    }
    cfg.folder_files = cfg.folder.is_some().then(|| files.into());
    Ok(cfg)
}
