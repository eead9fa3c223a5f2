//! A refused load in the command line's words: what would accept it is a flag, not a Rust
//! option.

use luasnap::bridge::persist::{Accept, LoadError};

/// The message for a load of a `--load` file that failed; a refusal names the flag (or the
/// game's declaration) that accepts what was refused.
pub fn load_error_on_the_command_line(e: &LoadError) -> String {
    match e {
        LoadError::Refused { message, accept } => {
            let how = match accept {
                Accept::TrustOwn => {
                    "if you trust the file, pass --trust own (the code it carries is then compiled)"
                        .to_string()
                }
                Accept::Permanent(name) => format!(
                    "if the game's state holds it on purpose, declare it in the game (G.permanents = {{ {name:?} }}) or pass --allow-permanent {name}"
                ),
                _ => accept.to_string(),
            };
            format!("cannot load: {message}; {how}")
        }
        e => e.to_string(),
    }
}
