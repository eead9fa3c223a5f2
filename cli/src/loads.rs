//! A refused load in the command line's words: what would accept it is a flag of the command
//! being used, not a Rust option (and a load that needs more memory names no Rust option).

use luasnap::bridge::persist::{Accept, LoadError};

/// What of a refused load a command can accept, for its hint: every command that loads a
/// save-game has `--allow-permanent NAME`.
#[derive(Debug, Clone, Copy)]
pub struct LoadFlags {
    /// The command's name, as the hint says it (`diff`).
    pub command: &'static str,
    /// The command has `--trust own` (`diff`, `simulate --load`).
    pub trust_own: bool,
    /// The command runs the game, so the names its `G.permanents` lists are accepted
    /// (`simulate`, `client`); `diff` only compiles it.
    pub runs_game: bool,
}

/// `luasnap simulate --load`.
pub const SIMULATE: LoadFlags = LoadFlags {
    command: "simulate",
    trust_own: true,
    runs_game: true,
};

/// `luasnap diff`.
pub const DIFF: LoadFlags = LoadFlags {
    command: "diff",
    trust_own: true,
    runs_game: false,
};

/// `luasnap client` (the server's save-games, for a late join or a resync).
pub const CLIENT: LoadFlags = LoadFlags {
    command: "client",
    trust_own: false,
    runs_game: true,
};

/// The message for a load that failed; a refusal names the flag of the command (or the
/// game's declaration, where the command runs the game) that accepts what was refused.
pub fn load_error_on_the_command_line(e: &LoadError, flags: LoadFlags) -> String {
    let (message, accept) = match e {
        LoadError::Refused { message, accept } => (message, accept),
        // No Rust option: the command's own words (`diff` adds its `--max-memory`).
        LoadError::NeedsMoreMemory { cap, message } => {
            return format!(
                "cannot load: the save-game needs more memory than luasnap {} lets a load take \
                 ({} MiB; the load stopped with: {message})",
                flags.command,
                cap >> 20
            )
        }
        // Damage, or an edit: the header's seal (`luasnap reseal`) is all that differs.
        LoadError::Corrupt { what }
            if what == "checksum mismatch" || what.contains(" body bytes, has ") =>
        {
            return format!(
                "{e} (if the file was edited on purpose, `luasnap reseal FILE` writes its \
                 checksum again; a load still checks everything else)"
            )
        }
        e => return e.to_string(),
    };
    let how = match accept {
        Accept::TrustOwn if flags.trust_own => {
            "if you trust the file, pass --trust own (the code it carries is then compiled)"
                .to_string()
        }
        Accept::TrustOwn => format!(
            "luasnap {} takes no code from the file: run the same game as the one that wrote it",
            flags.command
        ),
        Accept::Permanent(name) => {
            let mut how = "if the game's state holds it on purpose, ".to_string();
            if flags.runs_game {
                how += &format!(
                    "declare it in the game (G.permanents = {{ {name:?} }}) or pass --allow-permanent {name}"
                );
            } else {
                how += &format!(
                    "pass --allow-permanent {name} (luasnap {} compiles the game without running it: its G.permanents is not read)",
                    flags.command
                );
            }
            if flags.trust_own {
                how += ", or --trust own if you trust the file";
            }
            how
        }
        Accept::Permanents { names, more } => {
            let quoted: Vec<String> = names.iter().map(|n| format!("{n:?}")).collect();
            let flags_for: Vec<String> = names
                .iter()
                .map(|n| format!("--allow-permanent {n}"))
                .collect();
            let mut how = "if the game's state holds them on purpose, ".to_string();
            if flags.runs_game {
                how += &format!(
                    "declare them in the game (G.permanents = {{ {} }}) or pass {}",
                    quoted.join(", "),
                    flags_for.join(" ")
                );
            } else {
                how += &format!(
                    "pass {} (luasnap {} compiles the game without running it: its G.permanents is not read)",
                    flags_for.join(" "),
                    flags.command
                );
            }
            if *more > 0 {
                how += &format!(" (the next load names the {more} more)");
            }
            if flags.trust_own {
                how += ", or --trust own if you trust the file";
            }
            how
        }
        Accept::Rename(place) => {
            let mut how = Accept::rename_declarations(place);
            if !flags.runs_game {
                how += &format!(
                    " (luasnap {} compiles the game without running it: its declarations are not read)",
                    flags.command
                );
            }
            if flags.trust_own {
                how += "; or if you trust the file, pass --trust own (its saved code is then kept)";
            }
            how
        }
        _ => accept.to_string(),
    };
    format!("cannot load: {message}; {how}")
}
