//! Files an update moved, as the game declares them (`G.moved`, [`LoadOptions::moved`]):
//! where an update load ([`FunctionBinding::Current`](super::FunctionBinding::Current))
//! looks for this version of a chunk the save names. See "Moved files" in `docs/updates.md`.
//!
//! A saved function's chunk is its file (`@systems/combat.lua`); a declaration says which of
//! this version's files that file's functions are now in (`systems/combat/init.lua`), and the
//! load binds them there by the rules it uses for a file that kept its name: by place, by
//! rank among unnamed functions, by code. Declarations chain, in the order updates made them
//! (`a.lua` moved to `b.lua`, later `b.lua` to `c.lua`: a save naming `a.lua` finds `c.lua`),
//! so a game keeps every declaration it ever made. A folder (a path ending in `/`) moves every
//! file under it: the file's path under the old folder is its path under the new one.
//!
//! Invariants [`check`] keeps (every load and every start checks them): each side is a path
//! in a game's folder (no `@`, no absolute path, no `..`), both a file (`.lua`) or both a
//! folder (`/`), each old path declared once, no chain comes back to where it started.
//!
//! [`LoadOptions::moved`]: super::LoadOptions::moved

/// A file (or folder) an update moved: `G.moved = { ["systems/combat.lua"] =
/// "systems/combat/init.lua" }`, `G.moved = { ["old/"] = "new/" }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MovedFile {
    /// Its path in the game's folder in the version that wrote the save.
    pub from: String,
    /// Its path in this version (or, chained, in the version that moved it again).
    pub to: String,
}

impl MovedFile {
    /// `from` was moved to `to` (two files, or two folders ending in `/`).
    pub fn new(from: impl Into<String>, to: impl Into<String>) -> MovedFile {
        MovedFile {
            from: from.into(),
            to: to.into(),
        }
    }

    /// The declaration as the game writes it: `G.moved["systems/combat.lua"] = "..."`.
    pub fn declaration(&self) -> String {
        format!("G.moved[{:?}] = {:?}", self.from, self.to)
    }

    fn is_folder(&self) -> bool {
        self.from.ends_with('/')
    }

    /// Where this declaration sends the file `path`, if it covers it.
    fn apply(&self, path: &str) -> Option<String> {
        if self.is_folder() {
            let rest = path.strip_prefix(self.from.as_str())?;
            Some(format!("{}{rest}", self.to))
        } else {
            (path == self.from).then(|| self.to.clone())
        }
    }
}

/// Why `path` (one side of a declaration) can name no file or folder of a game, if it cannot.
fn bad_path(path: &str) -> Option<&'static str> {
    let body = path.strip_suffix('/').unwrap_or(path);
    if path.starts_with('@') || path.starts_with('=') {
        Some("names a file as Lua names a chunk: write its path in the game's folder, without the '@' (\"systems/combat.lua\")")
    } else if path.starts_with('/') || path.contains('\\') {
        Some("names a file by an absolute path or with '\\': write its path in the game's folder with '/' (\"systems/combat.lua\")")
    } else if body
        .split('/')
        .any(|part| part.is_empty() || part == "." || part == "..")
    {
        Some("names a path outside the game's folder or with an empty part: write its path in the game's folder (\"systems/combat.lua\")")
    } else if !path.ends_with('/') && !path.ends_with(".lua") {
        Some("names neither a Lua file (a path ending in \".lua\") nor a folder (a path ending in '/')")
    } else {
        None
    }
}

/// Checks the declarations' shapes before a load (see the module doc's invariants). The
/// message names the declaration.
pub(crate) fn check(moved: &[MovedFile]) -> Result<(), String> {
    let bad =
        |m: &MovedFile, why: &str| Err(format!("the game's declaration {} {why}", m.declaration()));
    for (i, m) in moved.iter().enumerate() {
        if let Some(why) = bad_path(&m.from).or_else(|| bad_path(&m.to)) {
            return bad(m, why);
        }
        if m.from.ends_with('/') != m.to.ends_with('/') {
            return bad(m, "moves a file to a folder or a folder to a file: write both as files (\"systems/combat.lua\" = \"systems/combat/init.lua\") or both as folders ending in '/' (\"systems/\" = \"src/systems/\")");
        }
        if m.from == m.to {
            return bad(m, "moves a file to itself");
        }
        if moved[..i].iter().any(|o| o.from == m.from) {
            return bad(m, "declares a path that another declaration declares too");
        }
    }
    for m in moved {
        if chain(moved, &m.from).is_err() {
            return bad(m, "starts a chain of moves that comes back to a path it moved (a cycle): write where each old path is in this version");
        }
    }
    Ok(())
}

/// The declaration that covers `path`: its own file's, else the longest folder's.
fn covering<'a>(moved: &'a [MovedFile], path: &str) -> Option<(&'a MovedFile, String)> {
    moved
        .iter()
        .filter_map(|m| Some((m, m.apply(path)?)))
        .max_by_key(|(m, _)| (!m.is_folder(), m.from.len()))
}

/// Where the file `path` of a saved version is in this one, following the declarations'
/// chain; Err if the chain comes back to a path it visited or takes more steps than there are
/// declarations (a folder moved into itself, `a/` to `a/b/`, never comes back): a cycle.
fn chain(moved: &[MovedFile], path: &str) -> Result<Option<String>, ()> {
    let mut seen = vec![path.to_string()];
    while let Some((_, next)) = covering(moved, &seen[seen.len() - 1]) {
        if seen.contains(&next) || seen.len() > moved.len() {
            return Err(());
        }
        seen.push(next);
    }
    Ok((seen.len() > 1).then(|| seen.pop()).flatten())
}

/// The chunk the game's declarations say a saved chunk (`@systems/combat.lua`) is now
/// (`@systems/combat/init.lua`), and the first declaration that moved it; None if none
/// covers it (the declarations are checked: [`check`]).
pub(crate) fn moved_chunk<'a>(
    moved: &'a [MovedFile],
    chunk: &[u8],
) -> Option<(Vec<u8>, &'a MovedFile)> {
    let path = std::str::from_utf8(chunk.strip_prefix(b"@")?).ok()?;
    let (first, _) = covering(moved, path)?;
    let to = chain(moved, path).ok()??;
    Some((format!("@{to}").into_bytes(), first))
}

/// The old paths and where their chains end, for the start's check (`runtime::declared`): a
/// file's own declaration, a folder's (its old and new folder).
pub(crate) fn ends(moved: &[MovedFile]) -> Vec<(&MovedFile, String)> {
    moved
        .iter()
        .map(|m| {
            let end = chain(moved, &m.from).ok().flatten().unwrap_or(m.to.clone());
            (m, end)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn to(moved: &[MovedFile], chunk: &str) -> Option<String> {
        moved_chunk(moved, chunk.as_bytes()).map(|(c, _)| String::from_utf8(c).unwrap())
    }

    #[test]
    fn a_file_and_a_folder_move_and_the_file_beats_its_folder() {
        let m = [
            MovedFile::new("systems/combat.lua", "src/combat/init.lua"),
            MovedFile::new("systems/", "src/systems/"),
        ];
        check(&m).unwrap();
        assert_eq!(
            to(&m, "@systems/combat.lua").as_deref(),
            Some("@src/combat/init.lua")
        );
        assert_eq!(
            to(&m, "@systems/log.lua").as_deref(),
            Some("@src/systems/log.lua")
        );
        assert_eq!(to(&m, "@main.lua"), None);
        assert_eq!(to(&m, "=game"), None);
        assert_eq!(
            to(&m, "systems/log.lua"),
            None,
            "a string given to load is no file"
        );
    }

    #[test]
    fn declarations_chain_in_the_order_updates_made_them() {
        let m = [
            MovedFile::new("b.lua", "c.lua"),
            MovedFile::new("a.lua", "b.lua"),
        ];
        check(&m).unwrap();
        assert_eq!(to(&m, "@a.lua").as_deref(), Some("@c.lua"));
        let (_, first) = moved_chunk(&m, b"@a.lua").unwrap();
        assert_eq!(first, &m[1]);
    }

    #[test]
    fn a_cycle_and_malformed_paths_are_refused_naming_the_declaration() {
        let e = check(&[
            MovedFile::new("a.lua", "b.lua"),
            MovedFile::new("b.lua", "a.lua"),
        ])
        .unwrap_err();
        assert!(
            e.contains("G.moved[\"a.lua\"]") && e.contains("cycle"),
            "{e}"
        );
        let e = check(&[MovedFile::new("a/", "a/b/")]).unwrap_err();
        assert!(e.contains("cycle"), "a folder moved into itself: {e}");
        for (from, to, says) in [
            ("@a.lua", "b.lua", "without the '@'"),
            ("a.lua", "/b.lua", "absolute path"),
            ("../a.lua", "b.lua", "outside the game's folder"),
            ("a.lua", "b", "neither a Lua file"),
            ("a.lua", "b/", "to a folder"),
            ("a.lua", "a.lua", "to itself"),
        ] {
            let e = check(&[MovedFile::new(from, to)]).unwrap_err();
            assert!(
                e.contains("G.moved") && e.contains(says),
                "{from} {to}: {e}"
            );
        }
        let e = check(&[
            MovedFile::new("a.lua", "b.lua"),
            MovedFile::new("a.lua", "c.lua"),
        ])
        .unwrap_err();
        assert!(e.contains("declares too"), "{e}");
    }
}
