//! What a load did with the functions a save holds.

/// A function a save holds, as a load names it: its chunk, its place there, and the line it
/// was defined at when saved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedFunction {
    /// The chunk's name as Lua shows it (`town/agent.lua`, `=game`).
    pub chunk: String,
    /// Its place in the chunk (`Agent.work`, `G.step > turn`; see [`FunctionBinding::Current`](super::FunctionBinding::Current)).
    pub place: String,
    /// The line it was defined at in the saved version.
    pub line: u64,
    /// The line this version's function at its place is defined at (rebound and moved
    /// functions), if this version has one.
    pub now: Option<u64>,
}

impl std::fmt::Display for SavedFunction {
    /// `place (chunk:line)`, the line this version's (or, without one, the saved one).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}:{})",
            self.place,
            self.chunk,
            self.now.unwrap_or(self.line)
        )
    }
}

/// A saved function bound to this version's function at the place the game declares for it
/// ([`Rename`](super::Rename): `G.renamed`, `G.removed`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenamedFunction {
    /// The saved function, at its saved place (`now`: the line of this version's function).
    pub saved: SavedFunction,
    /// The place it is bound to (`Entity.take_damage`).
    pub to: String,
    /// Whether the declaration is a removal with a replacement (`G.removed`), not a rename.
    pub replacement: bool,
}

impl std::fmt::Display for RenamedFunction {
    /// `Entity.hurt as Entity.take_damage (src/entity.lua:28)`, `... replaced by ...`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let how = if self.replacement {
            "replaced by"
        } else {
            "as"
        };
        let s = &self.saved;
        let line = s.now.unwrap_or(s.line);
        write!(f, "{} {how} {} ({}:{line})", s.place, self.to, s.chunk)
    }
}

/// A file of the save the game declares moved (`G.moved`, [`MovedFile`](super::MovedFile)),
/// whose functions the load looked for in the file it moved to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MovedChunk {
    /// The saved file's path in the game's folder (`systems/combat.lua`).
    pub from: String,
    /// The file of this version its functions were bound in (`systems/combat/init.lua`).
    pub to: String,
}

impl std::fmt::Display for MovedChunk {
    /// `systems/combat.lua to systems/combat/init.lua`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} to {}", self.from, self.to)
    }
}

/// What a load did with the functions the save holds (one entry per function, not per
/// closure).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// Functions this VM has with the code they were saved with.
    pub unchanged: usize,
    /// Functions whose code changed, bound to this version's function at the same place
    /// ([`FunctionBinding::Current`](super::FunctionBinding::Current)).
    pub rebound: Vec<SavedFunction>,
    /// Functions whose code did not change but moved to other lines (code added above them),
    /// bound to this version's function at the same place as rebound ones are.
    pub moved: Vec<SavedFunction>,
    /// Functions that keep the code they were saved with although this VM's differs: run by a
    /// suspended coroutine (own loads; the closure keeps it, so every later call through it
    /// runs the saved code too, coroutines the game starts from it later included), or loaded with [`FunctionBinding::Saved`](super::FunctionBinding::Saved).
    pub kept: Vec<SavedFunction>,
    /// Functions this version no longer has (removed or renamed), kept with their saved code
    /// (own loads; a foreign load refuses them).
    pub missing: Vec<SavedFunction>,
    /// Functions of chunks the game made at run time with `load`, which this VM had not
    /// compiled, compiled from the text the save carries: a foreign load of a game that
    /// declares `load` (see "Code the game compiled at run time" in `docs/save-games.md`).
    pub compiled: Vec<SavedFunction>,
    /// Functions new in this version that the saved module tables lacked, added to them
    /// (`module.path.name (chunk:line)`): a method an update adds. See "Functions new in this
    /// version" in `docs/updates.md`.
    pub added: Vec<String>,
    /// Functions bound to the place the game declares for them: renamed, or removed with a
    /// replacement (see "Renamed and removed functions" in `docs/updates.md`). Each is also
    /// counted as what its code is: unchanged, moved or rebound.
    pub renamed: Vec<RenamedFunction>,
    /// Unnamed functions (`G.init > (function #1)`) whose saved code this version has, at
    /// the same lines or moved, only at another rank among the unnamed functions of the same
    /// enclosing function (an update added an unnamed function above them): bound to that
    /// one, by its code, not to the function now at their saved rank. `to` is this version's
    /// place. Each is also counted as unchanged or moved.
    pub relocated: Vec<RenamedFunction>,
    /// Unnamed functions bound by their rank among the unnamed functions of their enclosing
    /// function to one whose code differs from the saved code, this version having no other
    /// unnamed function there with exactly the saved code (or several): the binding by rank
    /// is a guess, which the report shows. Each is also in `rebound`. Name such callbacks
    /// (see "What "the same place" is" in `docs/updates.md`).
    pub unnamed_rebound: Vec<SavedFunction>,
    /// Functions the game declares removed with nothing replacing them (`G.removed = {
    /// ["Log.label"] = true }`): the loaded state's references to them are a stand-in that
    /// raises an error naming the function when called.
    pub removed: Vec<SavedFunction>,
    /// The save's files the game declares moved (`G.moved`), each once: their functions were
    /// bound in the file they moved to, and are counted as what their code is there
    /// (unchanged, moved, rebound, renamed...). The functions' chunk in the other lists is
    /// the saved file's.
    pub moved_files: Vec<MovedChunk>,
    /// Functions new in this version not added (the Lua stack could not hold their
    /// upvalues while they were bound).
    pub not_added: Vec<String>,
}

impl LoadReport {
    /// One line for people: `412 functions unchanged, 3 rebound to this version (Agent.work
    /// (town/agent.lua:40), ...)`.
    pub fn summary(&self) -> String {
        fn list(v: &[SavedFunction]) -> String {
            let shown: Vec<String> = v.iter().take(4).map(|f| f.to_string()).collect();
            let more = v.len().saturating_sub(4);
            let mut s = shown.join(", ");
            if more > 0 {
                s.push_str(&format!(", and {more} more"));
            }
            s
        }
        let mut parts = vec![format!(
            "{} function{} unchanged",
            self.unchanged,
            if self.unchanged == 1 { "" } else { "s" }
        )];
        if !self.rebound.is_empty() {
            parts.push(format!(
                "{} rebound to this version ({})",
                self.rebound.len(),
                list(&self.rebound)
            ));
        }
        if !self.unnamed_rebound.is_empty() {
            parts.push(format!(
                "{} of them unnamed, bound by their rank to a function with other code: check it is the same callback, or name it ({})",
                self.unnamed_rebound.len(),
                list(&self.unnamed_rebound)
            ));
        }
        if !self.relocated.is_empty() {
            let shown: Vec<String> = self
                .relocated
                .iter()
                .take(4)
                .map(|f| {
                    let s = &f.saved;
                    format!(
                        "{} at {} ({}:{})",
                        s.place,
                        f.to,
                        s.chunk,
                        s.now.unwrap_or(s.line)
                    )
                })
                .collect();
            let more = self.relocated.len().saturating_sub(4);
            parts.push(format!(
                "{} unnamed found by their code at another rank ({}{})",
                self.relocated.len(),
                shown.join(", "),
                if more > 0 {
                    format!(", and {more} more")
                } else {
                    String::new()
                }
            ));
        }
        if !self.moved_files.is_empty() {
            let shown: Vec<String> = self
                .moved_files
                .iter()
                .take(4)
                .map(|m| m.to_string())
                .collect();
            let more = self.moved_files.len().saturating_sub(4);
            parts.push(format!(
                "{} file{} moved as the game declares ({}{})",
                self.moved_files.len(),
                if self.moved_files.len() == 1 { "" } else { "s" },
                shown.join(", "),
                if more > 0 {
                    format!(", and {more} more")
                } else {
                    String::new()
                }
            ));
        }
        if !self.moved.is_empty() {
            parts.push(format!(
                "{} moved to other lines, code unchanged ({})",
                self.moved.len(),
                list(&self.moved)
            ));
        }
        if !self.renamed.is_empty() {
            let shown: Vec<String> = self.renamed.iter().take(4).map(|f| f.to_string()).collect();
            let more = self.renamed.len().saturating_sub(4);
            parts.push(format!(
                "{} renamed as the game declares ({}{})",
                self.renamed.len(),
                shown.join(", "),
                if more > 0 {
                    format!(", and {more} more")
                } else {
                    String::new()
                }
            ));
        }
        if !self.removed.is_empty() {
            parts.push(format!(
                "{} removed as the game declares, nothing replacing them: a call raises an error ({})",
                self.removed.len(),
                list(&self.removed)
            ));
        }
        if !self.kept.is_empty() {
            parts.push(format!(
                "{} kept with their saved code, which every later call through them runs too, coroutines started from them later included ({})",
                self.kept.len(),
                list(&self.kept)
            ));
        }
        if !self.missing.is_empty() {
            parts.push(format!(
                "{} missing from this version, kept with their saved code ({})",
                self.missing.len(),
                list(&self.missing)
            ));
        }
        if !self.compiled.is_empty() {
            parts.push(format!(
                "{} compiled from the save's text (chunks the game made with load: {})",
                self.compiled.len(),
                list(&self.compiled)
            ));
        }
        if !self.added.is_empty() {
            let shown: Vec<&str> = self.added.iter().take(4).map(String::as_str).collect();
            let more = self.added.len().saturating_sub(4);
            parts.push(format!(
                "{} added (functions new in this version: {}{})",
                self.added.len(),
                shown.join(", "),
                if more > 0 {
                    format!(", and {more} more")
                } else {
                    String::new()
                }
            ));
        }
        if !self.not_added.is_empty() {
            parts.push(format!(
                "{} new in this version not added ({})",
                self.not_added.len(),
                self.not_added.join(", ")
            ));
        }
        parts.join(", ")
    }
}
