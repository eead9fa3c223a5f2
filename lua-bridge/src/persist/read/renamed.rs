//! Saved functions the game declares renamed or removed (`persist::renames`): bound to the
//! declared place of this version as `rebind.rs` binds a function at its own place, or
//! refused as the declaration says. Nothing here comes from the file but the saved place
//! the declarations are matched against.

use super::csrc::luasnap_proto_line;
use super::loader::{Fail, Loader};
use super::rebind::{shown_chunk, SavedProto};
use crate::persist::error::Accept;
use crate::persist::options::Trust;
use crate::persist::place::display;
use crate::persist::renames::{applied, missing_target, places_like, RenameTo};
use crate::persist::report::{RenamedFunction, SavedFunction};
use std::ffi::c_void;

impl Loader<'_> {
    /// Binds the saved function `f` (of the chunk whose current version is `current`) to the
    /// place the game declares for it, if a declaration applies: Ok(None) if none does (the
    /// caller binds it at its own place). A declaration whose place this version lacks, and a
    /// removal with no replacement, fail the load whatever its trust: the first is the game's
    /// mistake, the second the game's word that the saved code must not run.
    pub(super) fn bind_declared(
        &mut self,
        current: usize,
        f: &SavedProto<'_>,
        saved: Option<*const c_void>,
    ) -> Result<Option<*const c_void>, Fail> {
        let Some(a) = applied(&self.opts.renames, f.chunk, f.place) else {
            return Ok(None);
        };
        let (declaration, replacement) = (
            a.rename.declaration(),
            matches!(a.rename.to, RenameTo::Replacement(_)),
        );
        let saved_fn = SavedFunction {
            chunk: shown_chunk(f.chunk),
            place: display(f.place),
            line: f.line,
            now: None,
        };
        let Some(target) = a.target else {
            return Err(self.fail(format!(
                "the save holds the function {saved_fn}, which the game declares removed with no replacement ({declaration}): a save holding it does not load; to load such saves, name the function of this version that replaces it (G.removed[{:?}] = \"its replacement\")",
                a.rename.from
            )));
        };
        let Some(&p) = self.rb.currents[current].places.get(&target) else {
            if a.nested {
                return self.nested_missing(saved_fn, &declaration, &target, saved);
            }
            let like = places_like(self.rb.currents[current].places.keys(), &target);
            let missing = missing_target(a.rename, &target, &saved_fn.chunk, &like);
            return Err(self.fail(format!(
                "{missing}; the save holds the function {saved_fn}: correct the declaration"
            )));
        };
        let proto = SavedProto {
            hash: f.hash,
            line: f.line,
            chunk: f.chunk,
            place: &target,
            ups: f.ups.clone(),
            file_chunk: f.file_chunk,
            path: f.path,
        };
        let before = self.rb.rebounds.len();
        let bound = self.bind_place(current, proto, saved)?;
        if self.rb.rebounds.len() > before {
            if let Some(rb) = self.rb.rebounds.last_mut() {
                rb.declared = Some((saved_fn.clone(), replacement));
            }
        }
        // SAFETY: p is alive (its chunk's main closure is anchored for the load); reads only.
        let now = unsafe { luasnap_proto_line(p) }.max(0) as u64;
        self.rb.report.renamed.push(RenamedFunction {
            saved: SavedFunction {
                now: Some(now),
                ..saved_fn
            },
            to: display(&target),
            replacement,
        });
        Ok(bound)
    }

    /// A saved function nested in one the game declares renamed, which this version's
    /// function at the declared place does not have at `target`: missing, as a function at
    /// its own place would be (its saved code kept by an own load, a foreign load refused),
    /// and a declaration of its own binds it.
    fn nested_missing(
        &mut self,
        saved_fn: SavedFunction,
        declaration: &str,
        target: &[Vec<u8>],
        saved: Option<*const c_void>,
    ) -> Result<Option<*const c_void>, Fail> {
        let what = format!(
            "the save holds the function {saved_fn}, nested in a function the game declares renamed ({declaration}), and this version has no function at {}",
            display(target)
        );
        match saved {
            Some(p) => {
                self.rb.report.missing.push(saved_fn);
                Ok(Some(p))
            }
            None if self.opts.trust == Trust::Foreign => Err(self.refuse(
                format!("{what}; its saved code could be kept, but a foreign load takes no code from the file"),
                Accept::Rename(saved_fn.place),
            )),
            None => Err(self.fail(format!(
                "{what}, and the save-game carries no code to keep it with"
            ))),
        }
    }
}
