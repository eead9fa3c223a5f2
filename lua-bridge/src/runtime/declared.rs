//! The renames and removals a game declares for the loads of its saves (`G.renamed`,
//! `G.removed` in the table its script returns; see "Renamed and removed functions" in
//! `docs/updates.md`). They are read from this version's script before a save is loaded: a
//! save replaces the game's state, `G` included, but declares nothing.

use crate::bridge::error::VmError;
use crate::bridge::value::Value;
use crate::bridge::vm::Vm;
use crate::persist::renames::{missing_target, places_like};
use crate::persist::{MovedFile, Rename, RenameTo};
use std::collections::{HashMap, HashSet};

/// Reads both tables: on success `true` and then (kind, from, to) for each entry, kind `n`
/// (renamed), `r` (removed, replaced by `to`), `g` (removed, nothing replaces it: a stand-in
/// raises) or `x` (removed, saves holding it refused); else `false`
/// and why, in the game's words.
const READ: &str = r#"
local out = { true }
local function each(field, removal)
  local t = luasnap_game[field]
  if t == nil then return nil end
  if type(t) ~= 'table' then
    return 'G.' .. field .. ' must be a table keyed by saved places (G.' .. field
      .. ' = { ["Entity.hurt"] = ... }), got a ' .. type(t)
  end
  for k, v in next, t do
    if type(k) ~= 'string' then
      return 'G.' .. field .. ' has a key that is a ' .. type(k)
        .. ': each key is the place of a function in the saved version, a string such as "Entity.hurt"'
    end
    if type(v) == 'string' then
      out[#out + 1] = removal and 'r' or 'n'; out[#out + 1] = k; out[#out + 1] = v
    elseif removal and v == false then
      out[#out + 1] = 'x'; out[#out + 1] = k; out[#out + 1] = ''
    elseif removal and v == true then
      out[#out + 1] = 'g'; out[#out + 1] = k; out[#out + 1] = ''
    else
      return 'G.' .. field .. '[' .. string.format('%q', k) .. '] must be '
        .. (removal and 'the place of the function of this version that replaces it (a string such as "Entity.take_damage"), true (nothing replaces it: calls raise an error), or false (saves holding it are refused)'
                     or 'the place of the function in this version (a string such as "Entity.take_damage")')
        .. ', got a ' .. type(v)
    end
  end
  return nil
end
local why = each('renamed', false) or each('removed', true)
if why then return false, why end
return table.unpack(out)
"#;

/// The game's declared renames and removals, in the order of their saved places, or what is
/// wrong with them (in the game's words): the table's shape here, the places' shapes as
/// every load checks them.
pub(super) fn declared_renames(vm: &Vm) -> Result<Result<Vec<Rename>, String>, VmError> {
    let got = vm.exec(READ, "=luasnap")?;
    let text = |v: &Value| match v {
        Value::String(s) => String::from_utf8_lossy(s).into_owned(),
        _ => String::new(),
    };
    match got.split_first() {
        Some((Value::Boolean(true), rest)) => {
            let mut renames: Vec<Rename> = rest
                .chunks_exact(3)
                .map(|e| {
                    let (from, to) = (text(&e[1]), text(&e[2]));
                    match text(&e[0]).as_str() {
                        "n" => Rename::renamed(from, to),
                        "r" => Rename::replaced(from, to),
                        "g" => Rename::gone(from),
                        _ => Rename::removed(from),
                    }
                })
                .collect();
            renames.sort_by(|a, b| a.from.cmp(&b.from));
            Ok(crate::persist::renames::check(&renames).map(|()| renames))
        }
        Some((_, [why, ..])) => Ok(Err(text(why))),
        _ => Ok(Err(
            "the game's G.renamed and G.removed could not be read".into()
        )),
    }
}

/// Reads `G.moved`: on success `true` and then (from, to) for each entry; else `false` and why.
const READ_MOVED: &str = r#"
local t = luasnap_game.moved
if t == nil then return true end
if type(t) ~= 'table' then
  return false, 'G.moved must be a table keyed by the saved files\' paths (G.moved = { ["systems/combat.lua"] = "systems/combat/init.lua" }), got a ' .. type(t)
end
local out = { true }
for k, v in next, t do
  if type(k) ~= 'string' or type(v) ~= 'string' then
    return false, 'G.moved[' .. (type(k) == 'string' and string.format('%q', k) or tostring(k))
      .. '] must map a saved file\'s path to its path in this version, both strings in the game\'s folder ("systems/combat.lua" = "systems/combat/init.lua", or folders "old/" = "new/"), got a '
      .. type(k) .. ' key and a ' .. type(v) .. ' value'
  end
  out[#out + 1] = k; out[#out + 1] = v
end
return table.unpack(out)
"#;

/// The game's declared moved files (`G.moved`), in the order of their old paths, or what is
/// wrong with them (in the game's words): the table's shape here, the paths' as every load
/// checks them (`persist::moved::check`).
pub(super) fn declared_moved(vm: &Vm) -> Result<Result<Vec<MovedFile>, String>, VmError> {
    let got = vm.exec(READ_MOVED, "=luasnap")?;
    let text = |v: &Value| match v {
        Value::String(s) => String::from_utf8_lossy(s).into_owned(),
        _ => String::new(),
    };
    match got.split_first() {
        Some((Value::Boolean(true), rest)) => {
            let mut moved: Vec<MovedFile> = rest
                .chunks_exact(2)
                .map(|e| MovedFile::new(text(&e[0]), text(&e[1])))
                .collect();
            moved.sort_by(|a, b| a.from.cmp(&b.from));
            Ok(crate::persist::moved::check(&moved).map(|()| moved))
        }
        Some((_, [why, ..])) => Ok(Err(text(why))),
        _ => Ok(Err("the game's G.moved could not be read".into())),
    }
}

/// Checks, as the game starts, that each declared move is one this version agrees with: its
/// old path is no file of this version (saves of this version hold that file's functions,
/// which the declaration would send elsewhere), and where its chain ends is a Lua file of
/// the game that compiles (for a folder: a folder with at least one of the game's files).
/// Ok(Err(why)) names the declaration and what to correct.
pub(super) fn check_moved<E: From<VmError>>(
    moved: &[MovedFile],
    open: impl FnOnce() -> Result<GameFiles, E>,
) -> Result<Result<(), String>, E> {
    if moved.is_empty() {
        return Ok(Ok(()));
    }
    let mut files = open()?;
    let fix = "; correct G.moved in the table the game's script returns: each key is a file (or folder) of the version that wrote a save, each value where it is in this version";
    for (m, end) in crate::persist::moved::ends(moved) {
        let under = |path: &str, c: &String| match path.ends_with('/') {
            true => c.strip_prefix('@').is_some_and(|c| c.starts_with(path)),
            false => c.strip_prefix('@') == Some(path),
        };
        if let Some(c) = files.chunks.iter().find(|c| under(&m.from, c)) {
            let why = format!("names {}, which this version of the game still has ({}): a save of this version holds its functions, and the declaration would bind them in {end}; remove the declaration, or the file", m.from, shown(c));
            return Ok(Err(format!(
                "the game's declaration {} {why}{fix}",
                m.declaration()
            )));
        }
        let found = match end.ends_with('/') {
            true => files.chunks.iter().any(|c| under(&end, c)),
            false => files.places(&format!("@{end}"))?.is_some(),
        };
        if !found {
            let what = match end.ends_with('/') {
                true => "a folder with none of the game's files",
                false => "no Lua file of the game that compiles",
            };
            let via = if end == m.to {
                String::new()
            } else {
                " (through the declarations it chains to)".to_string()
            };
            return Ok(Err(format!(
                "the game's declaration {} moves it to {end}{via}, {what}{fix}",
                m.declaration()
            )));
        }
    }
    Ok(Ok(()))
}

/// Checks, as the game starts, that each declared new place and replacement is a function of
/// this version, as a load finds it (`persist::read::renamed`): the places of this version's
/// files, walked as the load walks them, without running anything of the game, in a VM of
/// their own (the game's VM is left as the script made it). A declaration naming its file
/// (`src/entity.lua:Entity.hurt`) is looked for in that file; one naming none, in every file
/// of the game (the script, its modules, the folder's Lua files), since it
/// applies in whichever file a save had a function at its old place. What is not checked,
/// and stays the load's to refuse: a declaration naming a file this version no longer has
/// (a function of a removed file is bound by no declaration, and the load says so), and a
/// declaration naming no file whose new place only some of the files with its old place have
/// (which file a save's function was in is known only from the save). The old place is not
/// checked: this version may have a function there again (see `docs/updates.md`).
///
/// `open` gives the game's files, called only if a declaration binds to a place. Ok(Err(why))
/// if a declaration names no function of this version, why naming it and what to correct.
pub(super) fn check_targets<E: From<VmError>>(
    renames: &[Rename],
    open: impl FnOnce() -> Result<GameFiles, E>,
) -> Result<Result<(), String>, E> {
    let targets = crate::persist::renames::targets(renames);
    if targets.is_empty() {
        return Ok(Ok(()));
    }
    let mut files = open()?;
    for crate::persist::renames::Target {
        rename,
        file,
        place: target,
    } in targets
    {
        let field = match rename.to {
            RenameTo::Replacement(_) => "G.removed",
            _ => "G.renamed",
        };
        let fix = format!(
            "; correct {field} in the table the game's script returns: a new place or replacement names a function this version has, as the load report writes places (\"Entity.take_damage\"), so that a save holding the old place loads"
        );
        let missing = match file {
            Some(file) => {
                let chunk = format!("@{file}");
                match files.places(&chunk)? {
                    None => continue,
                    Some(places) if places.contains(&target) => continue,
                    Some(places) => {
                        missing_target(rename, &target, file, &places_like(places.iter(), &target))
                    }
                }
            }
            None => {
                let mut near: Option<String> = None;
                let mut found = false;
                for chunk in files.chunks.clone() {
                    let Some(places) = files.places(&chunk)? else {
                        continue;
                    };
                    if places.contains(&target) {
                        found = true;
                        break;
                    }
                    let like = places_like(places.iter(), &target);
                    if near.is_none() && places.iter().any(|p| like_table(p, &target)) {
                        near = Some(missing_target(rename, &target, shown(&chunk), &like));
                    }
                }
                if found {
                    continue;
                }
                match near {
                    Some(near) => format!("{near}, nor does any other file of the game"),
                    None => missing_target(
                        rename,
                        &target,
                        "the game",
                        "no file of it has a function of that name",
                    ),
                }
            }
        };
        return Ok(Err(format!("{missing}{fix}")));
    }
    Ok(Ok(()))
}

/// Whether the top-level place `p` shares the first name's table with `target` (what
/// [`places_like`] lists), so its file is the one to show.
fn like_table(p: &[Vec<u8>], target: &[Vec<u8>]) -> bool {
    let first = target.first().map(Vec::as_slice).unwrap_or_default();
    match first.iter().rposition(|&b| b == b'.') {
        Some(i) => p.len() == 1 && p[0].starts_with(&first[..=i]),
        None => false,
    }
}

/// A chunk name as messages show a file (`src/entity.lua` for `@src/entity.lua`).
fn shown(chunk: &str) -> &str {
    chunk
        .strip_prefix('@')
        .or_else(|| chunk.strip_prefix('='))
        .unwrap_or(chunk)
}

/// This version's files for [`check_targets`]: compiled (never run) as they are first looked
/// at, in a VM that reads the game's saves without running it (`Game::reader_vm`), their
/// places kept.
pub(super) struct GameFiles {
    vm: Vm,
    sources: Option<crate::persist::ChunkSources>,
    /// The game's chunk names: the script's, its modules', then its folder's Lua files'.
    chunks: Vec<String>,
    places: HashMap<String, Option<HashSet<Vec<Vec<u8>>>>>,
}

impl GameFiles {
    /// The files of the chunks named `chunks` (`@src/entity.lua`), compiled in `vm` unless it
    /// has them, from `sources`.
    pub(super) fn new(
        vm: Vm,
        sources: Option<crate::persist::ChunkSources>,
        chunks: Vec<String>,
    ) -> GameFiles {
        GameFiles {
            vm,
            sources,
            chunks,
            places: HashMap::new(),
        }
    }

    /// The places of the chunk `chunk` (`@src/entity.lua`), compiled from the game's folder
    /// if the reader VM does not have it yet; None if the game has no such file or it does
    /// not compile (a load needing it fails on that, naming it).
    fn places(&mut self, chunk: &str) -> Result<Option<&HashSet<Vec<Vec<u8>>>>, VmError> {
        if !self.places.contains_key(chunk) {
            let mut found = self.vm.chunk_places(chunk)?;
            if found.is_none() {
                let source = chunk
                    .strip_prefix('@')
                    .and_then(|path| self.sources.as_ref()?.find(path));
                if let Some(source) = source {
                    if self.vm.compile(&source, chunk).is_ok() {
                        found = self.vm.chunk_places(chunk)?;
                    }
                }
            }
            self.places.insert(chunk.to_string(), found);
        }
        Ok(self.places[chunk].as_ref())
    }
}
