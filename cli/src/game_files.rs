//! The game's files as this run reads them, shared with the second processes it starts
//! (`simulate`'s second run of the reference, `p2p`'s second peer and its replays), so that
//! every process runs the very bytes read once for the run, not the folder as it is when a
//! second process starts or requires a module: a module edited during a run can no longer
//! make two processes run different code.
//!
//! The file is a record of the run's reads, in the system's temporary folder (readable by
//! this user only), removed when the run ends: a line naming the format, the main script,
//! then one entry per file of the game's folder looked for (its path, whether it was there,
//! its bytes), fields prefixed with their length. A file of the folder is read when a
//! process of the run first looks for it ([`GameConfig::read_folder_lazily`]): a process
//! takes the first entry for it in the record, else reads the file and appends it (then
//! takes the first entry: two processes that append at once agree). So the first process to
//! require a module, whichever it is, reads it, and every other gets its bytes; a module
//! never required is never read.

use luasnap::bridge::runtime::GameConfig;
use luasnap::bridge::FolderFiles;
use std::io::Write;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The first bytes of the file: what it is, and the version of its layout.
const MAGIC: &[u8] = b"luasnap game files 2\n";

/// Starts the record of `cfg`'s game (its main script; its folder's files as they are read)
/// for second processes ([`read`]), and makes `cfg`'s games read the folder through it; the
/// file is removed when the returned path drops.
pub(crate) fn write(cfg: &mut GameConfig) -> Result<tempfile::TempPath, String> {
    let mut out = MAGIC.to_vec();
    let mut field = |b: &[u8]| out.extend_from_slice(&framed(b));
    field(cfg.chunk_name.as_bytes());
    field(cfg.script.as_bytes());
    field(
        cfg.folder
            .as_deref()
            .map_or(&[][..], |f| f.as_os_str().as_bytes()),
    );
    for m in cfg.folder_files.iter().flat_map(|f| f.files()) {
        out.extend_from_slice(&entry(&m.path, Some(&m.source)));
    }
    let path = crate::scratch_file("game-", ".files")?;
    std::fs::write(&path, &out)
        .map_err(|e| format!("cannot write the game's files to {}: {e}", path.display()))?;
    if let Some(dir) = &cfg.folder {
        cfg.folder_files = Some(through(&path, dir));
    }
    Ok(path)
}

/// `cfg` with the game [`write`] started at `path`: its folder's files are the record's.
pub(crate) fn read(path: &Path, mut cfg: GameConfig) -> Result<GameConfig, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let (header, _) = parse(path, &bytes)?;
    let text = |b: &[u8]| String::from_utf8(b.to_vec()).map_err(|_| bad(path, "text"));
    cfg.chunk_name = text(header[0])?;
    cfg.script = text(header[1])?;
    cfg.folder = (!header[2].is_empty())
        .then(|| PathBuf::from(std::ffi::OsString::from_vec(header[2].to_vec())));
    cfg.folder_files = cfg.folder.as_deref().map(|dir| through(path, dir));
    Ok(cfg)
}

/// The folder `dir`'s files through the record at `record`.
fn through(record: &Path, dir: &Path) -> Arc<FolderFiles> {
    let record = record.to_path_buf();
    let reader = move |dir: &Path, path: &str| lookup(&record, dir, path);
    Arc::new(FolderFiles::with_reader(dir, Box::new(reader)))
}

/// The file `path` of the folder `dir` as the run read it: the record's first entry for it,
/// else read now and appended. Two processes that miss it at once both append; each then
/// takes the first entry, so both run the same bytes (an append is one `write` to a file
/// opened for appending, which the system does not interleave with another).
fn lookup(record: &Path, dir: &Path, path: &str) -> std::io::Result<Option<Vec<u8>>> {
    let named = |e: std::io::Error| {
        std::io::Error::new(
            e.kind(),
            format!(
                "the run's record of its game files, {}, is unreadable ({e}); a second process \
                 reads modules only through it: was it removed while the run went on?",
                record.display()
            ),
        )
    };
    let first = || -> std::io::Result<Option<Option<Vec<u8>>>> {
        let bytes = std::fs::read(record).map_err(named)?;
        let (_, entries) = parse(record, &bytes)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        Ok(entries
            .into_iter()
            .find(|(p, _)| *p == path.as_bytes())
            .map(|(_, source)| source.map(<[u8]>::to_vec)))
    };
    if let Some(source) = first()? {
        return Ok(source);
    }
    let source = FolderFiles::read_from_disk(dir, path)?;
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(record)
        .map_err(named)?;
    file.write_all(&entry(path, source.as_deref()))?;
    drop(file);
    first()?.ok_or_else(|| {
        std::io::Error::other(format!("{}: {path} was not recorded", record.display()))
    })
}

/// One entry of the record: the path, then the bytes, or nothing for a missing file.
fn entry(path: &str, source: Option<&[u8]>) -> Vec<u8> {
    let mut out = framed(path.as_bytes());
    out.extend_from_slice(&framed(&[u8::from(source.is_some())]));
    out.extend_from_slice(&framed(source.unwrap_or(&[])));
    out
}

fn framed(b: &[u8]) -> Vec<u8> {
    let mut out = (b.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(b);
    out
}

fn bad(path: &Path, what: &str) -> String {
    format!("{} is not a game's files ({what})", path.display())
}

/// A record's header fields (chunk name, script, folder) and entries (path, bytes if there).
type Parsed<'a> = ([&'a [u8]; 3], Vec<(&'a [u8], Option<&'a [u8]>)>);

fn parse<'a>(path: &Path, bytes: &'a [u8]) -> Result<Parsed<'a>, String> {
    let mut rest = bytes
        .strip_prefix(MAGIC)
        .ok_or_else(|| bad(path, "header"))?;
    let header = [0; 3].map(|_| take(&mut rest, path));
    let [chunk, script, folder] = header;
    let header = [chunk?, script?, folder?];
    let mut entries = Vec::new();
    while !rest.is_empty() {
        let name = take(&mut rest, path)?;
        let there = take(&mut rest, path)? == [1];
        let source = take(&mut rest, path)?;
        entries.push((name, there.then_some(source)));
    }
    Ok((header, entries))
}

/// The next field of `rest`, prefixed with its length.
fn take<'a>(rest: &mut &'a [u8], path: &Path) -> Result<&'a [u8], String> {
    let (len, tail) = rest
        .split_first_chunk::<8>()
        .ok_or_else(|| bad(path, "length"))?;
    let len = usize::try_from(u64::from_le_bytes(*len)).map_err(|_| bad(path, "length"))?;
    if len > tail.len() {
        return Err(bad(path, "cut short"));
    }
    let (value, tail) = tail.split_at(len);
    *rest = tail;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record that went away (or was never there) is named in the error `require` shows,
    /// with what to look at, instead of the module counting as missing.
    #[test]
    fn a_missing_record_is_named() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ai.lua"), "return 1").unwrap();
        let record = dir.path().join("gone.files");
        let files = through(&record, dir.path());
        let err = files.file("ai.lua").unwrap_err().to_string();
        assert!(
            err.contains("record of its game files") && err.contains(&record.display().to_string()),
            "{err}"
        );
    }

    /// A record whose bytes are not a record is named too.
    #[test]
    fn a_spoilt_record_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let record = dir.path().join("spoilt.files");
        std::fs::write(&record, b"not a record").unwrap();
        let err = through(&record, dir.path())
            .file("ai.lua")
            .unwrap_err()
            .to_string();
        assert!(err.contains("spoilt.files is not a game's files"), "{err}");
    }
}
