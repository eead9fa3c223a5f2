//! `luasnap reseal SAVE`: a save-game edited by hand, its header's body length and checksum
//! written again for the bytes it now has (`docs/save-games.md`, "Saves edited by hand").

use crate::save_file::{read_save, Body};
use luasnap::bridge::persist::reseal;
use std::path::PathBuf;

/// Options of `luasnap reseal`.
#[derive(Debug, clap::Args)]
pub struct ResealArgs {
    /// The save-game, edited.
    pub save: PathBuf,
    /// Write the resealed save here instead of over SAVE.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
}

/// Runs `luasnap reseal`.
pub fn run(args: ResealArgs) -> Result<(), String> {
    let bytes = read_save(&args.save, Body::Edited)?;
    let out = args.output.as_ref().unwrap_or(&args.save);
    let sealed = reseal(&bytes).map_err(|e| {
        format!(
            "{}: {e} (reseal writes only the body length and checksum)",
            args.save.display()
        )
    })?;
    let Some(sealed) = sealed else {
        if out != &args.save {
            write(out, &bytes)?;
        }
        eprintln!(
            "luasnap reseal: {}'s header matches its body already; {}",
            args.save.display(),
            if out == &args.save {
                "nothing written".to_string()
            } else {
                format!("copied to {}", out.display())
            }
        );
        return Ok(());
    };
    write(out, &sealed)?;
    let original = if out == &args.save {
        "ORIGINAL".to_string()
    } else {
        args.save.display().to_string()
    };
    eprintln!(
        "luasnap reseal: wrote {} ({} body bytes, sealed again); a load still checks everything \
         else, as for any save-game (`luasnap diff {original} {}` shows what the edit changed)",
        out.display(),
        sealed.len() - luasnap::bridge::persist::HEADER_LEN,
        out.display()
    );
    Ok(())
}

/// Writes `bytes` to `path` whole or not at all: to a file beside it, then renamed over it.
fn write(path: &std::path::Path, bytes: &[u8]) -> Result<(), String> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => std::path::Path::new("."),
    };
    let fail = |e: std::io::Error| format!("cannot write {}: {e}", path.display());
    let mut file = tempfile::NamedTempFile::new_in(dir).map_err(fail)?;
    std::io::Write::write_all(&mut file, bytes).map_err(fail)?;
    file.persist(path).map_err(|e| fail(e.error))?;
    Ok(())
}
