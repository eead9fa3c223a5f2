//! [`Saving`]: which frames a [`FrameSession`](crate::runtime::FrameSession) saves.

/// Which frames a [`FrameSession`] saves.
///
/// A rollback at delay `d` with [`Saving::EveryFrame`] costs one load and `d - 1` saves (each
/// re-simulated frame is saved again); with [`Saving::NewFrames`] or [`Saving::Sparse`] one
/// load and one save. On games whose frames write most of their heap a save costs about a
/// load, so that takes most of the copies out of a rollback: on the two churning library games
/// of the corpus at delay 4, 1.5-2.0 ms → 0.75-1.04 ms (docs/gc.md, "One save per
/// rollback").
/// What the fewer saves give up is depth, and only when confirmations come in bursts or
/// predictions were right for long: a rollback then loads the newest save before the frame
/// asked for and re-simulates the frames between with the inputs they ran with.
///
/// [`FrameSession`]: crate::runtime::FrameSession
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Saving {
    /// Every frame, before it is simulated, re-simulated frames included (GGPO's model). A
    /// rollback loads the frame of the first wrong prediction. [`FrameSession::new`]'s.
    ///
    /// [`FrameSession::new`]: crate::runtime::FrameSession::new
    #[default]
    EveryFrame,
    /// Every new frame ([`FrameSession::advance`]), but of the frames a rollback
    /// re-simulates only the state after the last confirmed frame
    /// ([`FrameSession::confirm`]): the one the next rollback loads when inputs arrive in
    /// order. A rollback into the other re-simulated frames (confirmations that jump several
    /// frames at once) loads that save and replays the frames between. Without
    /// [`FrameSession::confirm`] calls, rollbacks save no re-simulated frame but one a window
    /// of frames after the last save.
    ///
    /// [`FrameSession::advance`]: crate::runtime::FrameSession::advance
    /// [`FrameSession::confirm`]: crate::runtime::FrameSession::confirm
    NewFrames,
    /// Only the state after the last confirmed frame ([`FrameSession::confirm`]), as GGRS's
    /// sparse saving (`SessionBuilder::with_sparse_saving_mode`), and a frame whose newest
    /// save is a window of frames old (so rollbacks stay within the window when predictions
    /// are right for long). Fewest saves; rollbacks go back to the newest save, further than
    /// the first wrong frame whenever predictions were right since: for games whose steps
    /// cost little against their saves.
    ///
    /// [`FrameSession::confirm`]: crate::runtime::FrameSession::confirm
    Sparse,
}

impl Saving {
    /// `every`, `new` or `sparse` (the command line's words).
    pub fn name(self) -> &'static str {
        match self {
            Saving::EveryFrame => "every",
            Saving::Sparse => "sparse",
            Saving::NewFrames => "new",
        }
    }
}
