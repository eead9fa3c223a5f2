//! Functions an update renamed or removed, as the game declares them: where an update load
//! ([`FunctionBinding::Current`](super::FunctionBinding::Current)) binds a saved function
//! whose place this version no longer has. See "Renamed and removed functions" in
//! `docs/updates.md`.
//!
//! A declaration comes from the game (its script's `G.renamed` and `G.removed`, read before
//! the save is loaded, or [`LoadOptions::renames`](super::LoadOptions::renames)), never from
//! the save: the file can only hold functions at places, and a declaration says where the
//! game's *current* code for such a place is. It never takes code from the file: a renamed
//! function is bound to this version's function at the declared place under the rules that
//! apply to a function at its own place (unchanged, moved, rebound when its code changed, a
//! coroutine suspended in it resumes only in the same code).
//!
//! A declaration's place covers the functions nested in it: renaming `Entity.hurt` to
//! `Entity.take_damage` binds a saved `Entity.hurt > (function #1)` to
//! `Entity.take_damage > (function #1)`. The declaration naming the longest part of a saved
//! place applies.

/// A function an update renamed or removed, as the game declares it (`G.renamed`,
/// `G.removed`, [`LoadOptions::renames`](super::LoadOptions::renames)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rename {
    /// The function's place in the version that wrote the save, as the load report shows
    /// places (`Entity.hurt`, `G.step > turn`): in any of the game's files that had a
    /// function there, or in one file only when the place follows its path and a colon
    /// (`src/entity.lua:Entity.hurt`).
    pub from: String,
    /// What a saved function there is bound to now.
    pub to: RenameTo,
}

/// What became of a function an update renamed or removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RenameTo {
    /// Renamed (`G.renamed`): this version's function at this place of the same file is the
    /// saved one under another name. Its code is checked as a moved function's is: the same
    /// code is found as it is, changed code is rebound with the saved upvalues by name.
    Place(String),
    /// Removed, its saved references now this version's function at this place of the same
    /// file (`G.removed = { [from] = "place" }`), bound as a renamed one is (upvalues by
    /// name; a coroutine suspended in it resumes only in the same code).
    Replacement(String),
    /// Removed with no replacement (`G.removed = { [from] = false }`): a save holding it is
    /// refused under every trust level (the game says its saved code must not run), naming
    /// the function and this declaration.
    Removed,
    /// Removed, nothing replaces it (`G.removed = { [from] = true }`): the loaded state's
    /// references to it become a stand-in function of this binary (no code from the file)
    /// that raises an error naming the removed function when called, so a save that merely
    /// holds it loads and plays, and a call fails loudly.
    Gone,
}

impl Rename {
    /// `from` was renamed to `to` (a place in the same file).
    pub fn renamed(from: impl Into<String>, to: impl Into<String>) -> Rename {
        Rename {
            from: from.into(),
            to: RenameTo::Place(to.into()),
        }
    }

    /// `from` was removed; saved references to it become this version's function `by` (a
    /// place in the same file).
    pub fn replaced(from: impl Into<String>, by: impl Into<String>) -> Rename {
        Rename {
            from: from.into(),
            to: RenameTo::Replacement(by.into()),
        }
    }

    /// `from` was removed and nothing replaces it: saved references to it become a function
    /// that raises an error naming it when called.
    pub fn gone(from: impl Into<String>) -> Rename {
        Rename {
            from: from.into(),
            to: RenameTo::Gone,
        }
    }

    /// `from` was removed with no replacement: saves holding it are refused.
    pub fn removed(from: impl Into<String>) -> Rename {
        Rename {
            from: from.into(),
            to: RenameTo::Removed,
        }
    }

    /// The declaration as the game writes it: `G.renamed["Entity.hurt"] = "Entity.take_damage"`.
    pub fn declaration(&self) -> String {
        match &self.to {
            RenameTo::Place(to) => format!("G.renamed[{:?}] = {:?}", self.from, to),
            RenameTo::Replacement(by) => format!("G.removed[{:?}] = {:?}", self.from, by),
            RenameTo::Removed => format!("G.removed[{:?}] = false", self.from),
            RenameTo::Gone => format!("G.removed[{:?}] = true", self.from),
        }
    }

    /// The place it binds to, if any.
    fn to_place(&self) -> Option<&str> {
        match &self.to {
            RenameTo::Place(p) | RenameTo::Replacement(p) => Some(p),
            RenameTo::Removed | RenameTo::Gone => None,
        }
    }
}

/// The byte offsets in `s` that are outside a quoted key (`M["a > b"]`: `persist::place`).
fn unquoted_at(s: &str) -> impl Iterator<Item = usize> + '_ {
    let b = s.as_bytes();
    let (mut quoted, mut escaped) = (false, false);
    (0..b.len()).filter(move |&i| {
        let outside = !quoted;
        if quoted {
            match (escaped, b[i]) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => quoted = false,
                _ => {}
            }
        } else if b[i] == b'"' && i > 0 && b[i - 1] == b'[' {
            quoted = true;
        }
        outside
    })
}

/// `file:place` split into its file (None: any) and its place.
fn split_file(s: &str) -> (Option<&str>, &str) {
    match unquoted_at(s).find(|&i| s[i..].starts_with(".lua:")) {
        Some(i) => (Some(s[..i + 4].trim()), &s[i + 5..]),
        None => (None, s),
    }
}

/// A place as people write it (`G.step > turn`): its names, spaces around them dropped (a
/// `>` inside a quoted key is the key's).
fn names(place: &str) -> Vec<Vec<u8>> {
    let cuts: Vec<usize> = unquoted_at(place)
        .filter(|&i| place.as_bytes()[i] == b'>')
        .collect();
    let mut from = 0;
    let mut out = Vec::with_capacity(cuts.len() + 1);
    for i in cuts.into_iter().chain([place.len()]) {
        out.push(place[from..i].trim().as_bytes().to_vec());
        from = i + 1;
    }
    out
}

/// Checks the declarations' shapes before a load: each names a place, a rename stays in its
/// file, a place is declared once, and nothing is renamed to itself. The message names the
/// declaration.
pub(crate) fn check(renames: &[Rename]) -> Result<(), String> {
    let bad =
        |r: &Rename, why: &str| Err(format!("the game's declaration {} {why}", r.declaration()));
    for (i, r) in renames.iter().enumerate() {
        let (file, from) = split_file(&r.from);
        if let Some(why) = file.and_then(bad_file) {
            return bad(r, why);
        }
        if has_colon(from) || r.to_place().is_some_and(has_colon) {
            return bad(r, "writes a method with ':', which no place has: a place names a method with '.' (\"Entity.hurt\" for `function Entity:hurt`), and a file part ends in \".lua:\" (\"src/entity.lua:Entity.hurt\")");
        }
        if names(from).iter().any(Vec::is_empty) {
            return bad(r, "does not name a saved function's place (such as \"Entity.hurt\" or \"G.step > turn\")");
        }
        if let Some(to) = r.to_place() {
            let (file, place) = split_file(to);
            if file.is_some() {
                return bad(r, "names a file for the new place: a renamed function stays in its file (write the new place only)");
            }
            if names(place).iter().any(Vec::is_empty) {
                return bad(
                    r,
                    "does not name a place of this version (such as \"Entity.take_damage\")",
                );
            }
            if names(place) == names(from) {
                return bad(r, "renames a function to its own place");
            }
        }
        if renames[..i].iter().any(|o| same_place(&o.from, &r.from)) {
            return bad(r, "declares a place that another declaration declares too");
        }
    }
    Ok(())
}

/// Whether a declared place (its file part, if any, left out) has a ':' outside quoted keys:
/// a method as Lua code writes it (`Entity:hurt`), which matches no saved place.
fn has_colon(declared: &str) -> bool {
    let (_, place) = split_file(declared);
    unquoted_at(place).any(|i| place.as_bytes()[i] == b':')
}

/// Why the file part of a declared place (`src/entity.lua` in `src/entity.lua:Entity.hurt`)
/// can name no file of a game, if it cannot: such a declaration would apply to nothing, and
/// a ban written that way (`G.removed = { ["@main.lua:Debug.cheat"] = false }`) would be
/// lifted without a word. A file the game no longer has is a file an older save can hold.
fn bad_file(file: &str) -> Option<&'static str> {
    if file.starts_with('@') || file.starts_with('=') {
        Some("names its file as Lua names a chunk: write the file's path in the game's folder, without the '@' (\"src/entity.lua:Entity.hurt\")")
    } else if file.starts_with('/') || file.contains('\\') {
        Some("names its file by an absolute path or with '\\': write its path in the game's folder with '/' (\"src/entity.lua:Entity.hurt\")")
    } else if file
        .split('/')
        .any(|part| part.is_empty() || part == "." || part == "..")
    {
        Some("names a file outside the game's folder or with an empty part: write its path in the game's folder (\"src/entity.lua:Entity.hurt\")")
    } else {
        None
    }
}

/// Whether two declared places are the same (the same file, or none, and the same names,
/// spaces aside).
fn same_place(a: &str, b: &str) -> bool {
    let ((fa, pa), (fb, pb)) = (split_file(a), split_file(b));
    fa == fb && names(pa) == names(pb)
}

/// A declaration that applies to a saved function: the target place (None: removed with no
/// replacement), and the declaration.
pub(crate) struct Applied<'a> {
    pub(crate) target: Option<Vec<Vec<u8>>>,
    pub(crate) rename: &'a Rename,
    /// Whether the saved function is nested in the declared one (not the declared one).
    pub(crate) nested: bool,
}

/// The declaration that applies to the saved function at `place` in the chunk named `chunk`
/// (`@src/entity.lua`, or a host's `=game`; not a string given to `load`), if any: of those
/// whose place is `place` or encloses it (and whose file, if they name one, is the chunk's),
/// the one naming the most of it, and of two naming as much the one naming the file (the
/// narrower: `main.lua:Debug.cheat` beats `Debug.cheat`, in whatever order the game's table
/// lists them); the target is its place followed by the rest of `place`.
pub(crate) fn applied<'a>(
    renames: &'a [Rename],
    chunk: &[u8],
    place: &[Vec<u8>],
) -> Option<Applied<'a>> {
    let file = chunk
        .strip_prefix(b"@")
        .or_else(|| chunk.strip_prefix(b"="))?;
    let mut best: Option<((usize, bool), &Rename)> = None;
    for r in renames {
        let (f, from) = split_file(&r.from);
        if f.is_some_and(|f| f.as_bytes() != file) {
            continue;
        }
        let from = names(from);
        let n = from.len();
        let rank = (n, f.is_some());
        if n <= place.len() && place[..n] == from[..] && best.is_none_or(|(m, _)| rank > m) {
            best = Some((rank, r));
        }
    }
    let ((n, _), rename) = best?;
    let target = rename.to_place().map(|to| {
        let mut t = names(split_file(to).1);
        t.extend_from_slice(&place[n..]);
        t
    });
    Some(Applied {
        target,
        rename,
        nested: n < place.len(),
    })
}

/// How many of a chunk's places a message about a missing new place lists.
const PLACES_SHOWN: usize = 8;

/// The new place a declaration binds to (a rename's or a replacement's).
pub(crate) struct Target<'a> {
    pub(crate) rename: &'a Rename,
    /// The file its saved place names, if any: the new place is in that file.
    pub(crate) file: Option<&'a str>,
    /// The new place's names, as [`applied`] makes a target of it.
    pub(crate) place: Vec<Vec<u8>>,
}

/// The new place of each declaration that binds to one (not a removal with no replacement).
pub(crate) fn targets(renames: &[Rename]) -> Vec<Target<'_>> {
    renames
        .iter()
        .filter_map(|rename| {
            let to = rename.to_place()?;
            Some(Target {
                rename,
                file: split_file(&rename.from).0,
                place: names(split_file(to).1),
            })
        })
        .collect()
}

/// What a file has near the missing place `target`, for a message: the top-level places
/// of `places` that share the first name's table with it (`Entity.` for `Entity.take_dmg`),
/// or all its top-level ones.
pub(crate) fn places_like<'a>(
    places: impl Iterator<Item = &'a Vec<Vec<u8>>>,
    target: &[Vec<u8>],
) -> String {
    let first = target.first().map(Vec::as_slice).unwrap_or_default();
    let table = match first.iter().rposition(|&b| b == b'.') {
        Some(i) => &first[..=i],
        None => &[][..],
    };
    let mut like: Vec<String> = places
        .filter(|p| p.len() == 1 && p[0].starts_with(table))
        .map(|p| super::place::display(p))
        .collect();
    like.sort();
    let more = like.len().saturating_sub(PLACES_SHOWN);
    like.truncate(PLACES_SHOWN);
    match (like.is_empty(), more) {
        (true, _) => "it has no function of that name".into(),
        (false, 0) => format!("it has {}", like.join(", ")),
        (false, n) => format!("it has {}, and {n} more", like.join(", ")),
    }
}

/// The start of the message for a declaration whose new place `target` the chunk shown as
/// `chunk` does not have (`like`: [`places_like`]); a load and a game's start both say it.
pub(crate) fn missing_target(
    rename: &Rename,
    target: &[Vec<u8>],
    chunk: &str,
    like: &str,
) -> String {
    format!(
        "the game's declaration {} names {}, which this version of {chunk} does not have ({like})",
        rename.declaration(),
        super::place::display(target),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(s: &str) -> Vec<Vec<u8>> {
        names(s)
    }

    #[test]
    fn a_rename_covers_the_functions_nested_in_it_and_the_longest_applies() {
        let r = [
            Rename::renamed("Entity.hurt", "Entity.take_damage"),
            Rename::replaced("Entity.hurt > (function #2)", "Entity.on_hit"),
        ];
        let a = applied(&r, b"@src/entity.lua", &place("Entity.hurt")).unwrap();
        assert_eq!(a.target, Some(place("Entity.take_damage")));
        let a = applied(
            &r,
            b"@src/entity.lua",
            &place("Entity.hurt > (function #1)"),
        )
        .unwrap();
        assert_eq!(a.target, Some(place("Entity.take_damage > (function #1)")));
        let a = applied(
            &r,
            b"@src/entity.lua",
            &place("Entity.hurt > (function #2)"),
        )
        .unwrap();
        assert_eq!(a.target, Some(place("Entity.on_hit")));
        assert!(applied(&r, b"@src/entity.lua", &place("Entity.hurtful")).is_none());
        assert!(applied(&r, b"@src/entity.lua", &place("Entity")).is_none());
        // A host's chunk (`=game`) has places; a string given to `load` is not the game's.
        assert!(applied(&r, b"=game", &place("Entity.hurt")).is_some());
        assert!(applied(&r, b"return 1", &place("Entity.hurt")).is_none());
    }

    /// A method written as in the code (`Entity:hurt`) names no place: refused, on either
    /// side; a ':' inside a quoted key is the key's.
    #[test]
    fn a_method_written_with_a_colon_is_refused() {
        for r in [
            Rename::renamed("Entity:hurt", "Entity.take_damage"),
            Rename::renamed("Entity.hurt", "Entity:take_damage"),
            Rename::replaced("src/entity.lua:Entity:hurt", "Entity.on_hit"),
        ] {
            let e = check(std::slice::from_ref(&r)).unwrap_err();
            assert!(e.contains("writes a method with ':'"), "{e}");
        }
        check(&[Rename::renamed("M[\"a:b\"]", "M.c")]).unwrap();
        check(&[Rename::renamed("src/entity.lua:Entity.hurt", "Entity.c")]).unwrap();
    }

    #[test]
    fn a_file_in_the_declaration_limits_it_to_that_file() {
        let r = [Rename::removed("src/entity.lua:Entity.hurt")];
        let a = applied(&r, b"@src/entity.lua", &place("Entity.hurt")).unwrap();
        assert_eq!(a.target, None);
        assert!(applied(&r, b"@src/other.lua", &place("Entity.hurt")).is_none());
    }

    /// Of two declarations naming as much of a place, the one naming the file applies,
    /// whichever comes first (a game's table lists them in any order).
    #[test]
    fn a_declaration_naming_the_file_beats_one_naming_as_much_without() {
        let qualified = Rename::removed("main.lua:Debug.cheat");
        let anywhere = Rename::replaced("Debug.cheat", "Entity.new");
        for r in [
            [qualified.clone(), anywhere.clone()],
            [anywhere.clone(), qualified.clone()],
        ] {
            check(&r).unwrap();
            let a = applied(&r, b"@main.lua", &place("Debug.cheat")).unwrap();
            assert_eq!(a.rename, &qualified);
            let a = applied(&r, b"@src/debug.lua", &place("Debug.cheat")).unwrap();
            assert_eq!(a.rename, &anywhere);
        }
        // A longer place still beats a shorter one naming a file.
        let r = [
            Rename::removed("main.lua:Debug"),
            Rename::renamed("Debug > (function #1)", "Debug > (function #2)"),
        ];
        let a = applied(&r, b"@main.lua", &place("Debug > (function #1)")).unwrap();
        assert_eq!(a.rename, &r[1]);
    }

    /// A file part that can name no file of a game is refused, not left to match nothing.
    #[test]
    fn a_file_no_game_can_have_is_refused() {
        for from in [
            "@main.lua:Debug.cheat",
            "=main.lua:Debug.cheat",
            "/abs/main.lua:Debug.cheat",
            "../main.lua:Debug.cheat",
            "src//main.lua:Debug.cheat",
            "src\\main.lua:Debug.cheat",
        ] {
            let e = check(&[Rename::removed(from)]).unwrap_err();
            assert!(
                e.contains("G.removed") && e.contains("path in the game's folder"),
                "{from}: {e}"
            );
        }
        check(&[Rename::removed("old/gone.lua:Debug.cheat")]).unwrap();
    }

    #[test]
    fn malformed_declarations_are_named() {
        let e = check(&[Rename::renamed("Entity.hurt", "src/x.lua:Entity.x")]).unwrap_err();
        assert!(
            e.contains("G.renamed[\"Entity.hurt\"]") && e.contains("stays in its file"),
            "{e}"
        );
        let e = check(&[Rename::renamed("", "Entity.x")]).unwrap_err();
        assert!(e.contains("does not name a saved function's place"), "{e}");
        let e = check(&[Rename::replaced("A.f", "A.f")]).unwrap_err();
        assert!(e.contains("to its own place"), "{e}");
        let e = check(&[Rename::renamed("A.f", "A.g"), Rename::removed("A.f")]).unwrap_err();
        assert!(
            e.contains("G.removed[\"A.f\"] = false") && e.contains("declares too"),
            "{e}"
        );
        let e = check(&[
            Rename::renamed("A.f > g", "A.h"),
            Rename::removed(" A.f>g "),
        ])
        .unwrap_err();
        assert!(
            e.contains("declares too"),
            "spaces aside, the same place: {e}"
        );
        check(&[
            Rename::renamed("A.f", "A.g > h"),
            Rename::removed("src/a.lua:B.f"),
        ])
        .unwrap();
    }

    #[test]
    fn a_quoted_key_keeps_its_separators() {
        assert_eq!(
            place(r#"M["a > b"] > turn"#),
            [br#"M["a > b"]"#.to_vec(), b"turn".to_vec()]
        );
        assert_eq!(split_file(r#"M["x.lua:y"]"#), (None, r#"M["x.lua:y"]"#));
        assert_eq!(
            split_file(r#"a.lua:M["\"]>"]"#),
            (Some("a.lua"), r#"M["\"]>"]"#)
        );
        assert_eq!(place(r#"M["\"]>"] > f"#).len(), 2);
    }
}
