//! The renames and removals a game declares for the loads of its saves (`G.renamed`,
//! `G.removed` in the table its script returns; see "Renamed and removed functions" in
//! `docs/updates.md`). They are read from this version's script before a save is loaded: a
//! save replaces the game's state, `G` included, but declares nothing.

use crate::bridge::error::VmError;
use crate::bridge::value::Value;
use crate::bridge::vm::Vm;
use crate::persist::Rename;

/// Reads both tables: on success `true` and then (kind, from, to) for each entry, kind `n`
/// (renamed), `r` (removed, replaced by `to`) or `x` (removed, no replacement); else `false`
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
    else
      return 'G.' .. field .. '[' .. string.format('%q', k) .. '] must be '
        .. (removal and 'the place of the function of this version that replaces it (a string such as "Entity.take_damage"), or false (saves holding it are refused)'
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
