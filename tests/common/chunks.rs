//! Editing the chunk definitions of a decoded save-game (the forger's tree).

use luasnap::bridge::persist::forge::{self, Node, Proto};

/// Calls `f` on the first new prototype's chunk definition in a decoded save; panics if the
/// save has none.
pub fn with_first_chunk(node: &mut Node, f: &mut dyn FnMut(&mut forge::ChunkDef<Vec<u8>>)) {
    let mut done = false;
    forge::walk_mut(node, &mut |n| {
        if let Node::LClosure {
            proto: Proto::New {
                home: Some(home), ..
            },
            ..
        } = n
        {
            if let (Some(def), false) = (home.def.as_mut(), done) {
                f(def);
                done = true;
            }
        }
    });
    assert!(done, "a chunk definition in the save");
}
