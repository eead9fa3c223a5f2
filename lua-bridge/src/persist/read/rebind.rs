//! Loading a save into a newer version of the game ([`FunctionBinding::Current`]): each saved
//! function is bound to the function at the same place (`persist::place`) in this VM's
//! current version of its chunk, and takes its saved upvalues by name.
//!
//! A chunk the save names is in one of three states here: the same as the VM's current
//! version (its functions found by path, unchanged), changed (each function looked up by its
//! place: the same code there is unchanged, other code is *rebound*, no function there is
//! *missing*), or not among the game's chunks (its functions found as before: the VM's
//! identical code, or the save's compiled by an own load). Nothing here takes code from the
//! file: a rebound closure runs a prototype this VM compiled from the game's own source.
//!
//! How a closure of a rebound function is made depends on the trust level:
//!
//! - **Foreign**: at once, as a closure of the newer function with one upvalue slot per
//!   upvalue of it, followed by one per saved upvalue (the *saved slots*, where the file's
//!   upvalues arrive, so that later closures sharing one by its saved number find it); each
//!   saved upvalue is shared into the newer function's upvalue of its name as it arrives. A
//!   suspended coroutine running such a closure, or a closure sharing a suspended coroutine's
//!   local, is at a pc of the saved code: it resumes in the newer function only if that is the
//!   saved code at other lines, and is refused otherwise (`resume.rs`).
//! - **Own**: as a closure of the saved function (compiled from the save's text) with enough
//!   slots for either version, its upvalues as saved, so load-time functions run the saved
//!   code as Eris would. When the walk is over, each is bound in place to the newer function
//!   (`luasnap_closure_rebind`), unless a suspended coroutine runs it or it shares one's
//!   local: then it keeps its saved code (it is at a pc of that code).
//!
//! Upvalues the newer function has and the saved one did not (a new local helper, `_ENV` for
//! a function that now reads a global) are filled when the walk is over, with the variable of
//! the chunk's main function they stand for: as a closure this load made holds it (the saved
//! game's value), else as the game's own closures hold it (the newer version's value), else
//! the main function's own upvalue (`_ENV`); a local of an enclosing function starts as nil.
//!
//! Invariants: every slot of every closure holds a valid upvalue at all times (Lua's
//! collector and `getupvalname` go over all slots; see csrc/proto.c); every prototype a closure
//! gets is the VM's own, anchored for the load (a current chunk's main closure is anchored in
//! `protos` under its prototype's address).

use super::closure::upvalue_name;
use super::csrc::{
    luasnap_chunk_current, luasnap_closure_rebind, luasnap_closure_trim, luasnap_each_lclosure,
    luasnap_proto_hash, luasnap_proto_hash_shifted, luasnap_proto_line, luasnap_proto_nupvalues,
    luasnap_proto_upvalue_desc, luasnap_push_closure_n, luasnap_push_lclosure,
    luasnap_upval_closed_slot, luasnap_upval_join_slot, luasnap_upval_set_slot,
};
use super::ids::push_obj;
use super::loader::{Fail, Loader};
use super::state::{Binding, Current, ModuleVar, Rebinding, Rebound};
use crate::persist::error::Accept;
use crate::persist::place::{each_place, family_key, upvalue_map, upvalue_names};
use crate::persist::report::{LoadReport, RenamedFunction, SavedFunction};
use crate::persist::slots::Slots;
use mlua_sys::{self as ffi, lua_State};
use std::collections::{HashMap, HashSet};
use std::ffi::{c_int, c_void};

/// Lua's most upvalues in a closure (MAXUPVAL).
const MAX_SLOTS: usize = 255;

/// A saved function as the file describes it (format 6).
pub(super) struct SavedProto<'a> {
    /// Its fingerprint, and the line it was defined at.
    pub hash: u64,
    pub line: u64,
    /// Its chunk's name as the file gives it, and its place there.
    pub chunk: &'a [u8],
    pub place: &'a [Vec<u8>],
    /// Its upvalues' names.
    pub ups: Vec<Vec<u8>>,
    /// Its chunk (`Loader::chunks`) and its path of child indices there.
    pub file_chunk: usize,
    pub path: &'a [u64],
}

/// What a saved place finds in this version (`Loader::place_target`).
enum PlaceTarget {
    /// This function.
    Function(*const c_void),
    /// No function.
    None,
    /// Several functions read as the place and none has the saved code: these.
    Shared(Vec<*const c_void>),
}

/// What [`Loader::find_place`] found for a saved function.
struct FoundPlace {
    /// The function (or functions) there.
    target: PlaceTarget,
    /// The place an unnamed function was found at by its code, if not its saved place.
    relocated: Option<Vec<Vec<u8>>>,
    /// An unnamed function taken by its rank among its siblings, its code found nowhere.
    by_rank: bool,
}

/// Where an upvalue to share is: a closure this load made (object id) or one of the game's
/// (anchored in `protos` under its address), and the slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Holder {
    Loaded(u32, c_int),
    Game(*const c_void, c_int),
    /// The current chunk's main closure (anchored under its prototype's address).
    Main(*const c_void, c_int),
}

impl Rebinding {
    /// The main prototype of current chunk `c`.
    pub(super) fn currents_main(&self, c: usize) -> *const c_void {
        self.currents[c].main
    }
}

/// A chunk name as Lua shows it in messages (`town/agent.lua`, `game`).
pub(super) fn shown_chunk(name: &[u8]) -> String {
    match name.first() {
        Some(b'@' | b'=') => crate::persist::place::printable(&name[1..]),
        _ => string_chunk(name),
    }
}

/// A chunk named by its source (a string given to `load` without a name) as Lua shows it
/// (`luaO_chunkid`): `[string "first line..."]`, one line, at most `LUA_IDSIZE` (60) bytes.
pub(super) fn string_chunk(source: &[u8]) -> String {
    const ROOM: usize = 60 - "[string \"...\"]".len() - 1;
    let line = source.split(|&b| b == b'\n').next().unwrap_or_default();
    if line.len() == source.len() && source.len() < ROOM {
        return format!("[string \"{}\"]", crate::persist::place::printable(source));
    }
    let cut = &line[..line.len().min(ROOM)];
    format!("[string \"{}...\"]", crate::persist::place::printable(cut))
}

/// Makes slot `slot` of the loaded closure `id` share the upvalue `holder` holds, if that one
/// is closed.
///
/// # Safety
/// Protected context, 2 free slots; `s` a load's slots; the holder a loaded object, a game
/// closure or a main closure anchored under its address in `protos`.
unsafe fn share_from(L: *mut lua_State, s: Slots, id: u32, slot: c_int, holder: Holder) {
    // SAFETY: callers' contract; [closure, holder]; the C side checks both slots, and only a
    // closed upvalue is shared.
    unsafe {
        push_obj(L, s, id);
        let hslot = match holder {
            Holder::Loaded(hid, hslot) => {
                push_obj(L, s, hid);
                hslot
            }
            Holder::Game(cl, hslot) | Holder::Main(cl, hslot) => {
                ffi::lua_rawgetp(L, s.protos, cl);
                hslot
            }
        };
        if luasnap_upval_closed_slot(L, -1, hslot) != 0 {
            luasnap_upval_join_slot(L, -2, slot, -1, hslot);
        }
        ffi::lua_settop(L, -3);
    }
}

/// Whether a place's last name is that of an unnamed function (`(function #k)`).
fn is_unnamed(name: &[u8]) -> bool {
    name.starts_with(b"(function #")
}

/// Whether prototype `p` is the code with fingerprint `hash` defined at `line`: at those lines,
/// or moved alike.
///
/// # Safety
/// `p` is a live prototype.
unsafe fn same_code_at(p: *const c_void, hash: u64, line: u64) -> bool {
    // SAFETY: callers' contract; reads only.
    unsafe {
        if luasnap_proto_hash(p) == hash {
            return true;
        }
        let now = luasnap_proto_line(p).max(0) as u64;
        now != line && luasnap_proto_hash_shifted(p, line as i64 - now as i64) == hash
    }
}

/// The state of a walk over the game's closures (`Loader::look_up_game_holders`).
struct ClosureWalk {
    /// The prototypes looked for.
    protos: HashSet<*const c_void>,
    /// Closures this load made, which are not the game's.
    loaded: HashSet<*const c_void>,
    /// The first of the game's closures found of each prototype.
    found: HashMap<*const c_void, *const c_void>,
}

/// `luasnap_each_lclosure`'s callback: records the first closure of each prototype looked
/// for that this load did not make.
///
/// # Safety
/// `ud` a [`ClosureWalk`] borrowed for the walk.
unsafe extern "C" fn collect_closure(cl: *const c_void, p: *const c_void, ud: *mut c_void) {
    // SAFETY: ud is the walk's state (callers' contract).
    let w = unsafe { &mut *(ud as *mut ClosureWalk) };
    if w.protos.contains(&p) && !w.loaded.contains(&cl) {
        w.found.entry(p).or_insert(cl);
    }
}

impl Loader<'_> {
    /// The VM's current version of the chunk named `name`, looked up once per load (its main
    /// closure anchored), or None: not one of the game's chunks.
    ///
    /// # Safety
    /// Protected context, two free slots; `s` this load's slots.
    pub(super) unsafe fn current_chunk(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        name: &[u8],
    ) -> Option<usize> {
        if let Some(&c) = self.rb.by_name.get(name) {
            return c;
        }
        // SAFETY: protected context (callers' contract); the name is read for the call.
        let main = unsafe { luasnap_chunk_current(L, name.as_ptr().cast(), name.len()) };
        let found = (!main.is_null()).then(|| {
            // SAFETY: the main closure is on top: anchored under its prototype (popped).
            unsafe { ffi::lua_rawsetp(L, s.protos, main) };
            let mut cur = Current {
                main,
                places: HashMap::new(),
                parents: HashMap::new(),
                families: HashMap::new(),
            };
            // SAFETY: main is alive (anchored above); the walk reads only.
            unsafe {
                each_place(main, &mut |p, parent, place| {
                    cur.places.entry(place.to_vec()).or_insert(p);
                    cur.parents.insert(p, parent);
                    if let Some(key) = family_key(place) {
                        cur.families.entry(key).or_default().push(p);
                    }
                })
            };
            self.rb.currents.push(cur);
            self.rb.currents.len() - 1
        });
        self.rb.by_name.insert(name.to_vec(), found);
        found
    }

    /// Binds the saved function `f` (of the chunk whose current version is `current`) to this
    /// version's function at its place, as the next prototype index. Returns the prototype
    /// to make its closures of (for a rebound one in an own load, `saved`, the save's
    /// compiled code) and records its binding; None if this version has no function there
    /// (the caller then uses `saved`, or refuses the load).
    ///
    /// The steps: find the function at the place (an unnamed one by its code if it moved,
    /// noted as relocated); several candidates and none with the saved code keep `saved` or
    /// refuse; the same code is bound unchanged; other code is rebound.
    pub(super) fn bind_place(
        &mut self,
        current: usize,
        f: SavedProto<'_>,
        saved: Option<*const c_void>,
    ) -> Result<Option<*const c_void>, Fail> {
        let found = self.find_place(current, &f);
        if let Some(at) = &found.relocated {
            self.note_relocated(current, &f, at, &found.target);
        }
        let target = match found.target {
            PlaceTarget::Function(target) => target,
            PlaceTarget::None => return Ok(None),
            PlaceTarget::Shared(family) => return self.keep_shared(&f, &family, saved).map(Some),
        };
        // SAFETY: target is alive (its chunk's main closure is anchored for the load).
        if unsafe { luasnap_proto_hash(target) } == f.hash {
            self.bind_unchanged(current);
            return Ok(Some(target));
        }
        self.bind_rebound(current, f, target, found.by_rank, saved)
            .map(Some)
    }

    /// Looks up the function at `f`'s place in current chunk `current`. A function nested in
    /// an unnamed one found at another rank is looked up under it; an unnamed function whose
    /// code is not at its place is looked for by its code among its unnamed siblings.
    fn find_place(&self, current: usize, f: &SavedProto<'_>) -> FoundPlace {
        let (hash, line) = (f.hash, f.line);
        let moved_under = self.relocated_place(current, f.place);
        let lookup: &[Vec<u8>] = moved_under.as_deref().unwrap_or(f.place);
        let mut found = FoundPlace {
            target: self.place_target(current, lookup, hash, line),
            relocated: None,
            by_rank: false,
        };
        if !lookup.last().is_some_and(|n| is_unnamed(n)) {
            return found;
        }
        let differs = match found.target {
            // SAFETY: t is alive (its chunk's main closure is anchored for the load).
            PlaceTarget::Function(t) => !unsafe { same_code_at(t, hash, line) },
            PlaceTarget::None => true,
            PlaceTarget::Shared(_) => false,
        };
        if differs {
            match self.unnamed_by_code(current, lookup, hash, line) {
                Some((at, p)) => {
                    found.target = PlaceTarget::Function(p);
                    found.relocated = Some(at);
                }
                None => found.by_rank = matches!(found.target, PlaceTarget::Function(_)),
            }
        }
        found
    }

    /// Records that the unnamed function saved at `f`'s place is at `at` in this version (its
    /// nested functions are looked up under `at`), and reports it.
    fn note_relocated(
        &mut self,
        current: usize,
        f: &SavedProto<'_>,
        at: &[Vec<u8>],
        target: &PlaceTarget,
    ) {
        self.rb
            .relocated
            .insert((current, f.place.to_vec()), at.to_vec());
        // SAFETY: the function found is alive (anchored with its chunk); reads only.
        let now = match target {
            PlaceTarget::Function(p) => unsafe { luasnap_proto_line(*p) }.max(0) as u64,
            _ => f.line,
        };
        self.rb.report.relocated.push(RenamedFunction {
            saved: SavedFunction {
                chunk: shown_chunk(f.chunk),
                place: crate::persist::place::display(f.place),
                line: f.line,
                now: Some(now),
            },
            to: crate::persist::place::display(at),
            replacement: false,
        });
    }

    /// Several functions of this version read as `f`'s place and none has the saved code:
    /// the saved code (`saved`, an own load's), kept and reported, or the load is refused.
    fn keep_shared(
        &mut self,
        f: &SavedProto<'_>,
        family: &[*const c_void],
        saved: Option<*const c_void>,
    ) -> Result<*const c_void, Fail> {
        let what = self.shared_place(f.chunk, f.place, f.line, family);
        let Some(saved) = saved else {
            return Err(self.refuse(what, Accept::TrustOwn));
        };
        self.rb.report.kept.push(SavedFunction {
            chunk: shown_chunk(f.chunk),
            place: crate::persist::place::display(f.place),
            line: f.line,
            now: None,
        });
        Ok(saved)
    }

    /// Binds the next prototype index to this version's function with the saved code.
    fn bind_unchanged(&mut self, current: usize) {
        self.rb.report.unchanged += 1;
        self.rb.bindings.insert(
            self.protos.len(),
            Binding {
                rebound: None,
                current: Some(current),
            },
        );
    }

    /// Binds the next prototype index to `target`, this version's function at `f`'s place
    /// with other code: records the rebound function and how its upvalues map by name.
    /// Returns the prototype to make its closures of: `saved` in an own load (bound when the
    /// walk is over), else `target` (bound at once).
    fn bind_rebound(
        &mut self,
        current: usize,
        f: SavedProto<'_>,
        target: *const c_void,
        by_rank: bool,
        saved: Option<*const c_void>,
    ) -> Result<*const c_void, Fail> {
        let SavedProto {
            hash,
            line,
            chunk,
            place,
            ups,
            file_chunk,
            path,
        } = f;
        // SAFETY: target is alive (its chunk's main closure is anchored for the load); reads
        // only.
        let (target_n, target_ups) = unsafe {
            (
                luasnap_proto_nupvalues(target).max(0) as usize,
                upvalue_names(target),
            )
        };
        // SAFETY: as above; reads only.
        let now = unsafe { luasnap_proto_line(target) }.max(0) as u64;
        // The same code at other lines: every line of its tree moved alike.
        // SAFETY: as above; reads only.
        let moved = now != line
            && unsafe { luasnap_proto_hash_shifted(target, line as i64 - now as i64) } == hash;
        let function = SavedFunction {
            chunk: shown_chunk(chunk),
            place: crate::persist::place::display(place),
            line,
            now: Some(now),
        };
        let at_once = saved.is_none();
        if at_once && ups.len() + target_n > MAX_SLOTS {
            return Err(self.refuse(
                format!("the save holds the function {function}, whose code changed in this version, with more upvalues than a closure can hold while it is rebound"),
                Accept::TrustOwn,
            ));
        }
        let from_saved = upvalue_map(&ups, &target_ups);
        let mut to_target = vec![None; ups.len()];
        for (j, i) in from_saved.iter().enumerate() {
            if let Some(i) = *i {
                to_target[i] = Some(j);
            }
        }
        self.rb.rebounds.push(Rebound {
            target,
            current,
            saved_n: ups.len(),
            target_n,
            from_saved,
            to_target,
            saved_names: ups,
            function,
            reported: false,
            moved,
            saved_code: !at_once,
            chunk: file_chunk,
            path: path.to_vec(),
            hash,
            same_code: None,
            declared: None,
            by_rank,
            removed: false,
        });
        let r = self.rb.rebounds.len() - 1;
        self.rb.bindings.insert(
            self.protos.len(),
            Binding {
                rebound: Some(r),
                current: Some(current),
            },
        );
        match saved {
            Some(saved) => Ok(saved),
            None => {
                // Every closure is rebound (or the load refused).
                self.report_rebound(r);
                Ok(target)
            }
        }
    }

    /// Binds the saved function `f`, which the game declares removed with nothing replacing
    /// it, to the stand-in `target` (this binary's code, no upvalues: `renamed.rs`) as a
    /// rebound function with other code is bound: its closures become closures of the
    /// stand-in (an own load makes them of the saved code and binds them when the walk is
    /// over; one a suspended coroutine runs keeps its saved code, as for any changed
    /// function). Returns the prototype to make its closures of.
    pub(super) fn bind_stand_in(
        &mut self,
        current: usize,
        f: &SavedProto<'_>,
        saved: Option<*const c_void>,
        target: *const c_void,
        saved_fn: SavedFunction,
    ) -> *const c_void {
        let at_once = saved.is_none();
        self.rb.rebounds.push(Rebound {
            target,
            current,
            saved_n: f.ups.len(),
            target_n: 0,
            from_saved: Vec::new(),
            to_target: vec![None; f.ups.len()],
            saved_names: f.ups.clone(),
            function: SavedFunction {
                place: "(a stand-in that raises an error)".into(),
                ..saved_fn.clone()
            },
            reported: false,
            moved: false,
            saved_code: !at_once,
            chunk: f.file_chunk,
            path: f.path.to_vec(),
            hash: f.hash,
            same_code: None,
            declared: Some((saved_fn, true)),
            by_rank: false,
            removed: true,
        });
        let r = self.rb.rebounds.len() - 1;
        self.rb.bindings.insert(
            self.protos.len(),
            Binding {
                rebound: Some(r),
                current: Some(current),
            },
        );
        match saved {
            Some(saved) => saved,
            None => {
                self.report_rebound(r);
                target
            }
        }
    }

    /// This version's function at saved `place` (of the function with fingerprint `hash`,
    /// defined at `line`), looked up in its family (`persist::place`, module doc): a family
    /// of one is the function, also for a save that wrote `M["a.b"]` as `M.a.b`; in a larger
    /// one only the member with the saved code (at its lines, or moved) is.
    fn place_target(&self, current: usize, place: &[Vec<u8>], hash: u64, line: u64) -> PlaceTarget {
        let cur = &self.rb.currents[current];
        let exact = cur.places.get(place).copied();
        if self.rb.quoted_places {
            return exact.map_or(PlaceTarget::None, PlaceTarget::Function);
        }
        // A file from before places quoted keys: `M.a.b` may be this version's `M["a.b"]`.
        let family = family_key(place).and_then(|k| cur.families.get(&k));
        let quoted = |p: &*const c_void| {
            cur.places
                .iter()
                .any(|(k, q)| q == p && k.iter().any(|n| n.windows(2).any(|w| w == b"[\"")))
        };
        let Some(family) = family.filter(|f| f.len() > 1 && f.iter().any(quoted)) else {
            let alone = family.filter(|f| f.len() == 1).map(|f| f[0]);
            return exact
                .or(alone)
                .map_or(PlaceTarget::None, PlaceTarget::Function);
        };
        // SAFETY: the family's prototypes are alive (their chunk's main closure is anchored
        // for the load); reads only.
        let same = |&&p: &&*const c_void| unsafe { luasnap_proto_hash(p) } == hash;
        // SAFETY: as above.
        let moved = |&&p: &&*const c_void| unsafe {
            let now = luasnap_proto_line(p).max(0) as u64;
            now != line && luasnap_proto_hash_shifted(p, line as i64 - now as i64) == hash
        };
        match family
            .iter()
            .find(same)
            .or_else(|| family.iter().find(moved))
        {
            Some(&p) => PlaceTarget::Function(p),
            None => PlaceTarget::Shared(family.clone()),
        }
    }

    /// The saved `place` with its longest prefix that is an unnamed function found at another
    /// rank ([`Rebinding::relocated`]) replaced by this version's place of it; None if no
    /// prefix was relocated.
    fn relocated_place(&self, current: usize, place: &[Vec<u8>]) -> Option<Vec<Vec<u8>>> {
        if self.rb.relocated.is_empty() {
            return None;
        }
        (1..place.len()).rev().find_map(|k| {
            let at = self.rb.relocated.get(&(current, place[..k].to_vec()))?;
            let mut p = at.clone();
            p.extend_from_slice(&place[k..]);
            Some(p)
        })
    }

    /// For a saved unnamed function at `place` (with fingerprint `hash`, defined at `line`)
    /// whose rank this version gives to other code or to nothing: the one unnamed function
    /// of the same enclosing function in this version with exactly the saved code (at the
    /// saved lines; else, if none, moved alike), and its place. None if there is none, or
    /// several (which one the saved function is cannot be told: it is bound by rank).
    fn unnamed_by_code(
        &self,
        current: usize,
        place: &[Vec<u8>],
        hash: u64,
        line: u64,
    ) -> Option<(Vec<Vec<u8>>, *const c_void)> {
        let cur = &self.rb.currents[current];
        let parent = &place[..place.len() - 1];
        let mut siblings: Vec<(&Vec<Vec<u8>>, *const c_void)> = cur
            .places
            .iter()
            .filter(|(k, _)| {
                k.len() == place.len()
                    && k[..parent.len()] == *parent
                    && k.last().is_some_and(|n| is_unnamed(n))
                    && k.as_slice() != place
            })
            .map(|(k, &p)| (k, p))
            .collect();
        siblings.sort_by(|a, b| a.0.cmp(b.0));
        // SAFETY: the siblings are alive (their chunk's main closure is anchored); reads only.
        let exact: Vec<_> = siblings
            .iter()
            .filter(|(_, p)| unsafe { luasnap_proto_hash(*p) } == hash)
            .collect();
        let pick = match exact.len() {
            1 => exact[0],
            0 => {
                // SAFETY: as above.
                let moved: Vec<_> = siblings
                    .iter()
                    .filter(|(_, p)| unsafe { same_code_at(*p, hash, line) })
                    .collect();
                if moved.len() != 1 {
                    return None;
                }
                moved[0]
            }
            _ => return None,
        };
        Some((pick.0.clone(), pick.1))
    }

    /// The refusal of a saved function whose place a family of several reads as (see
    /// [`Loader::place_target`]), naming them.
    fn shared_place(
        &self,
        chunk: &[u8],
        place: &[Vec<u8>],
        line: u64,
        family: &[*const c_void],
    ) -> String {
        let file = shown_chunk(chunk);
        let cur_places: HashMap<*const c_void, &Vec<Vec<u8>>> = self
            .rb
            .currents
            .iter()
            .flat_map(|c| c.places.iter().map(|(k, &p)| (p, k)))
            .collect();
        let members: Vec<String> = family
            .iter()
            .map(|p| {
                let name = cur_places
                    .get(p)
                    .map_or_else(String::new, |k| crate::persist::place::display(k));
                // SAFETY: alive for the load (see place_target); reads only.
                let now = unsafe { luasnap_proto_line(*p) }.max(0);
                format!("{name} ({file}:{now})")
            })
            .collect();
        format!(
            "the save holds the function {} ({file}:{line}), whose code changed in this version, at a place written before places told a quoted key (M[\"a.b\"]) from a path of names (M.a.b): {} functions of this version read as it ({}), and which one it is cannot be told",
            crate::persist::place::display(place),
            family.len(),
            members.join(", ")
        )
    }

    /// Rebound function `r` as a message about its saved code names it, with `what` said of
    /// it: `G.step (main.lua:4), whose code changed in this version`; a function bound by
    /// the game's declaration by its saved place, and the declared target as another's code.
    pub(super) fn rebound_named(&self, r: usize, what: &str) -> String {
        let rb = &self.rb.rebounds[r];
        match &rb.declared {
            None => format!("{}, {what}", rb.function),
            Some((saved, true)) => format!(
                "{saved}, which the game declares replaced by {}, a function with other code",
                rb.function
            ),
            Some((saved, false)) => format!(
                "{saved}, which the game declares renamed {}, {what}",
                rb.function
            ),
        }
    }

    /// Adds rebound function `r` to the report's `rebound` list, or `moved` if only its lines
    /// changed (once).
    fn report_rebound(&mut self, r: usize) {
        let rb = &mut self.rb.rebounds[r];
        if !rb.reported {
            rb.reported = true;
            let list = if rb.removed {
                &mut self.rb.report.removed
            } else if rb.moved {
                &mut self.rb.report.moved
            } else {
                &mut self.rb.report.rebound
            };
            list.push(match (&rb.declared, rb.removed) {
                (Some((saved, _)), true) => saved.clone(),
                _ => rb.function.clone(),
            });
            if rb.by_rank && !rb.moved {
                self.rb.report.unnamed_rebound.push(rb.function.clone());
            }
        }
    }

    /// Records that a closure this load made (object `id`, of prototype `p`, prototype index
    /// `index`) belongs to a current chunk, if its function is directly inside the chunk's
    /// main function: it holds module-level variables others may share.
    pub(super) fn note_closure(&mut self, id: u32, p: *const c_void, current: Option<usize>) {
        let Some(c) = current else { return };
        let cur = &self.rb.currents[c];
        if cur.parents.get(&p) == Some(&cur.main) {
            self.rb.holders.push((id, p, c));
        }
    }

    /// Makes the closure of rebound function `r` (object `id`; the prototype `p` from
    /// `Loader::proto`, the upvalue count `n` the file gives), leaves it on top and records
    /// it. Returns the upvalue count its frame reads (the saved one).
    ///
    /// # Safety
    /// Protected context, two free slots.
    pub(super) unsafe fn push_rebound_closure(
        &mut self,
        L: *mut lua_State,
        id: u32,
        r: usize,
        p: *const c_void,
        n: u64,
    ) -> Result<c_int, Fail> {
        let rb = &self.rb.rebounds[r];
        // SAFETY: p is a prototype of this VM, anchored for the load.
        let saved_ok = !rb.saved_code || unsafe { luasnap_proto_nupvalues(p) } as u64 == n;
        if n != rb.saved_n as u64 || !saved_ok {
            return Err(self.malformed("closure upvalue count differs from its function's"));
        }
        let slots = if rb.saved_code {
            rb.target_n.max(rb.saved_n)
        } else {
            rb.target_n + rb.saved_n
        };
        // SAFETY: protected context (callers' contract); p is anchored for the load and has at
        // most `slots` upvalues (the target's or, own, the saved function's: checked against
        // the saved count by the caller).
        if unsafe { luasnap_push_closure_n(L, p, slots as c_int) } == 0 {
            return Err(self.malformed("closure upvalue count differs from its function's"));
        }
        // SAFETY: the closure is on top.
        let ptr = unsafe { ffi::lua_topointer(L, -1) };
        self.rb.pending.push((id, r));
        self.rb.pending_by_id.insert(id, r);
        self.rb.pending_ptrs.insert(ptr, id);
        if !rb.saved_code {
            let (target, current) = (rb.target, rb.current);
            for j in 0..rb.target_n {
                if rb.from_saved[j].is_none() {
                    self.rb.unfilled.push((id, j as c_int, target, current));
                }
            }
            self.note_closure(id, target, Some(current));
        }
        Ok(n as c_int)
    }

    /// For a closure this load made of a rebound function's target: the slot its saved
    /// upvalue `i` (1-based) arrives in, and the target's slot of its name. None for any
    /// other closure (its upvalue `i` is in slot `i - 1`).
    pub(super) fn saved_slot(&self, id: u32, i: c_int) -> Option<(c_int, Option<c_int>)> {
        let rb = &self.rb.rebounds[*self.rb.pending_by_id.get(&id)?];
        if rb.saved_code {
            return None;
        }
        let i = (i - 1) as usize;
        Some((
            (rb.target_n + i) as c_int,
            rb.to_target.get(i).copied().flatten().map(|j| j as c_int),
        ))
    }

    /// The name of upvalue slot `slot` (0-based) of the closure read as `id`, made of
    /// prototype `p`: a slot past a rebound closure's target upvalues holds a saved upvalue,
    /// named as the save names it; any other, as `p` does. None: no name (stripped).
    ///
    /// # Safety
    /// `p` is the closure's live prototype; the name lives as long as it and this loader.
    pub(super) unsafe fn slot_name(&self, id: u32, p: *const c_void, slot: c_int) -> Option<&[u8]> {
        if let Some(&r) = self.rb.pending_by_id.get(&id) {
            let rb = &self.rb.rebounds[r];
            if !rb.saved_code && slot >= 0 && slot as usize >= rb.target_n {
                return rb
                    .saved_names
                    .get(slot as usize - rb.target_n)
                    .map(Vec::as_slice)
                    .filter(|n| !n.is_empty());
            }
        }
        // SAFETY: callers' contract.
        unsafe { upvalue_name(p, slot + 1) }
    }

    /// The slot holding saved upvalue `index` (1-based) of the closure read before as `id`,
    /// if it is one made of a rebound function's target (None: slot `index - 1`), checked
    /// against its saved upvalue count.
    pub(super) fn shared_slot(&self, id: u32, index: u64) -> Option<Result<c_int, ()>> {
        let rb = &self.rb.rebounds[*self.rb.pending_by_id.get(&id)?];
        if rb.saved_code {
            return None;
        }
        Some(if index == 0 || index > rb.saved_n as u64 {
            Err(())
        } else {
            Ok((rb.target_n as u64 + index - 1) as c_int)
        })
    }

    /// Sets saved upvalue `i` of closure `id` (at -2) from the value on top (popped), in a
    /// closure made of a rebound function's target: its saved slot, shared into the target's
    /// upvalue of its name. Returns false, doing nothing, for any other closure.
    ///
    /// # Safety
    /// Protected context; the closure at -2, the value on top.
    pub(super) unsafe fn set_rebound_upvalue(
        &mut self,
        L: *mut lua_State,
        id: u32,
        i: c_int,
    ) -> bool {
        let Some((slot, to)) = self.saved_slot(id, i) else {
            return false;
        };
        // SAFETY: the closure at -2 has `slot` (its saved slots follow the target's); the
        // value on top is popped into it, then the target's slot shares it.
        unsafe {
            luasnap_upval_set_slot(L, -2, slot);
            if let Some(j) = to {
                luasnap_upval_join_slot(L, -1, j, -1, slot);
            }
        }
        true
    }

    /// When the walk is over: own loads bind their pending closures to this version's
    /// functions (those a suspended coroutine needs keep their saved code), then every
    /// upvalue no saved one filled gets the module-level variable it stands for.
    ///
    /// # Safety
    /// Protected context, 8 free slots; `s` this load's slots.
    pub(super) unsafe fn finish_rebinding(
        &mut self,
        L: *mut lua_State,
        s: Slots,
    ) -> Result<(), Fail> {
        for k in 0..self.rb.pending.len() {
            let (id, r) = self.rb.pending[k];
            if self.rb.rebounds[r].saved_code {
                // SAFETY: callers' contract.
                unsafe { self.rebind_saved(L, s, id, r)? };
            }
        }
        let unfilled = std::mem::take(&mut self.rb.unfilled);
        let empty: HashSet<(u32, c_int)> = unfilled.iter().map(|u| (u.0, u.1)).collect();
        let mut holders = HashMap::new();
        for &(id, slot, p, c) in &unfilled {
            let Some(var) = self.module_var(c, p, slot) else {
                continue;
            };
            let holder = match holders.get(&(c, var)) {
                Some(&h) => h,
                None => {
                    // SAFETY: callers' contract.
                    let h = unsafe { self.holder_of(L, s, c, var, &empty) };
                    holders.insert((c, var), h);
                    h
                }
            };
            if let Some(holder) = holder {
                // SAFETY: callers' contract.
                unsafe { share_from(L, s, id, slot, holder) };
            }
        }
        // The saved version's upvalues in the slots past the function's are no longer named
        // by the file: released, so the closure holds only what its function reads.
        for &(id, _) in &self.rb.pending {
            // SAFETY: callers' contract; objs[id] is a Lua closure this load made; popped.
            unsafe {
                push_obj(L, s, id);
                luasnap_closure_trim(L, -1);
                ffi::lua_settop(L, -2);
            }
        }
        Ok(())
    }

    /// Binds closure `id` of rebound function `r`, made of its saved code, to the target in
    /// place, or keeps its saved code if it is pinned.
    ///
    /// # Safety
    /// As [`Loader::finish_rebinding`].
    unsafe fn rebind_saved(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        id: u32,
        r: usize,
    ) -> Result<(), Fail> {
        if self.rb.pinned.contains(&id) {
            let rb = &self.rb.rebounds[r];
            let f = rb.declared.as_ref().map_or(&rb.function, |d| &d.0).clone();
            if !self.rb.report.kept.contains(&f) {
                self.rb.report.kept.push(f);
            }
            return Ok(());
        }
        let rb = &self.rb.rebounds[r];
        let from: Vec<c_int> = rb
            .from_saved
            .iter()
            .map(|i| i.map_or(-1, |i| i as c_int))
            .collect();
        let (target, current) = (rb.target, rb.current);
        // SAFETY: callers' contract; objs[id] is the closure, with max(saved, target) slots
        // (push_rebound_closure), each `from` slot one of its saved upvalues; the target is
        // anchored for the load. Pops the closure.
        let done = unsafe {
            push_obj(L, s, id);
            let done = luasnap_closure_rebind(L, -1, target, from.as_ptr());
            ffi::lua_settop(L, -2);
            done
        };
        if done == 0 {
            return Err(self.malformed("a rebound closure lost its upvalue slots"));
        }
        for (j, f) in from.iter().enumerate() {
            if *f < 0 {
                self.rb.unfilled.push((id, j as c_int, target, current));
            }
        }
        self.note_closure(id, target, Some(current));
        self.report_rebound(r);
        Ok(())
    }

    /// The variable of chunk `c`'s main function that upvalue `j` of its function `p` stands
    /// for, following the upvalue descriptors up the enclosing functions; None for a local of
    /// an enclosing function other than the main one (a variable of one activation).
    fn module_var(&self, c: usize, mut p: *const c_void, mut j: c_int) -> Option<ModuleVar> {
        let cur = &self.rb.currents[c];
        loop {
            let mut local = 0;
            // SAFETY: p is a prototype of the current chunk, alive (anchored); reads only.
            let idx = unsafe { luasnap_proto_upvalue_desc(p, j, &mut local) };
            if idx < 0 {
                return None;
            }
            let parent = *cur.parents.get(&p)?;
            if parent == cur.main {
                return Some(if local != 0 {
                    ModuleVar::Local(idx)
                } else {
                    ModuleVar::Upvalue(idx)
                });
            }
            if local != 0 || parent.is_null() {
                return None;
            }
            (p, j) = (parent, idx);
        }
    }

    /// A closure holding the module-level variable `var` of chunk `c`: one this load made
    /// (the saved game's variable), else one of the game's own (this version's), else, for
    /// an upvalue of the main function, its main closure.
    ///
    /// # Safety
    /// As [`Loader::finish_rebinding`].
    unsafe fn holder_of(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        c: usize,
        var: ModuleVar,
        unfilled: &HashSet<(u32, c_int)>,
    ) -> Option<Holder> {
        for &(id, p, hc) in &self.rb.holders {
            if hc != c {
                continue;
            }
            if let Some(slot) = self.slot_of(c, p, var) {
                if !unfilled.contains(&(id, slot)) {
                    return Some(Holder::Loaded(id, slot));
                }
            }
        }
        if let ModuleVar::Upvalue(k) = var {
            return Some(Holder::Main(self.rb.currents[c].main, k));
        }
        // SAFETY: callers' contract.
        unsafe { self.look_up_game_holders(L, s, c) };
        self.rb
            .game_holders
            .get(&(c, var))
            .map(|&(cl, slot)| Holder::Game(cl, slot))
    }

    /// The slot of a closure of `p` (directly inside chunk `c`'s main function) that holds
    /// `var`, if it holds it.
    fn slot_of(&self, c: usize, p: *const c_void, var: ModuleVar) -> Option<c_int> {
        // SAFETY: p is alive (anchored for the load); reads only.
        let n = unsafe { luasnap_proto_nupvalues(p) };
        (0..n).find(|&u| self.module_var(c, p, u) == Some(var))
    }

    /// Finds, once per chunk, the game's own closures of the functions directly inside chunk
    /// `c`'s main function (made before this load), and anchors one holding each module-level
    /// local they share.
    ///
    /// # Safety
    /// As [`Loader::finish_rebinding`].
    unsafe fn look_up_game_holders(&mut self, L: *mut lua_State, s: Slots, c: usize) {
        if !self.rb.game_looked.insert(c) {
            return;
        }
        let cur = &self.rb.currents[c];
        let children: HashSet<*const c_void> = cur
            .parents
            .iter()
            .filter(|(_, &parent)| parent == cur.main)
            .map(|(&p, _)| p)
            .collect();
        let mut walk = ClosureWalk {
            protos: children,
            loaded: self.rb.pending_ptrs.keys().copied().collect(),
            found: HashMap::new(),
        };
        // SAFETY: the collector is stopped for the load; the callback only reads.
        unsafe { luasnap_each_lclosure(L, collect_closure, &mut walk as *mut _ as *mut c_void) };
        let mut found: Vec<(*const c_void, *const c_void)> = walk.found.into_iter().collect();
        found.sort_by_key(|&(p, _)| p as usize);
        for (p, cl) in found {
            // SAFETY: p is alive (anchored with its chunk).
            let n = unsafe { luasnap_proto_nupvalues(p) };
            let mut anchored = false;
            for u in 0..n {
                if let Some(var @ ModuleVar::Local(_)) = self.module_var(c, p, u) {
                    if let std::collections::hash_map::Entry::Vacant(e) =
                        self.rb.game_holders.entry((c, var))
                    {
                        e.insert((cl, u));
                        anchored = true;
                    }
                }
            }
            if anchored {
                // SAFETY: cl was alive in the walk and no Lua code ran since; anchored under
                // its address for the rest of the load.
                unsafe {
                    luasnap_push_lclosure(L, cl);
                    ffi::lua_rawsetp(L, s.protos, cl);
                }
            }
        }
    }

    /// Records a refusal: what is refused and what would accept it.
    pub(super) fn refuse(&mut self, what: impl Into<String>, accept: Accept) -> Fail {
        self.accept = Some(accept);
        self.fail(what)
    }

    /// The report of this load (what it did with the saved functions).
    pub fn take_report(&mut self) -> LoadReport {
        std::mem::take(&mut self.rb.report)
    }

    /// The names of the chunks whose saved code is this version's (see
    /// `Rebinding::unchanged_chunks`), taken.
    pub fn take_unchanged_chunks(&mut self) -> std::collections::HashSet<Vec<u8>> {
        std::mem::take(&mut self.rb.unchanged_chunks)
    }
}

#[cfg(test)]
mod chunk_name_tests {
    use super::shown_chunk;

    #[test]
    fn a_chunk_named_by_its_source_shows_as_lua_shows_it() {
        assert_eq!(shown_chunk(b"@lib/bump.lua"), "lib/bump.lua");
        assert_eq!(shown_chunk(b"=stdin"), "stdin");
        assert_eq!(shown_chunk(b"return 1"), "[string \"return 1\"]");
        assert_eq!(
            shown_chunk(b"\nreturn function(system, e) e.x = 1 end"),
            "[string \"...\"]"
        );
        assert_eq!(
            shown_chunk(b"return function(system, e)\n e.x = 1 end"),
            "[string \"return function(system, e)...\"]"
        );
        let long = shown_chunk(&[b'x'; 200]);
        assert_eq!(long, format!("[string \"{}...\"]", "x".repeat(45)));
        assert!(!long.contains('\n'));
    }
}
