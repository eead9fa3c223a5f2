//! `luasnap bench`'s options (the measurements themselves are benchmarks, not tests).

mod support;
use support::{output, stderr};

#[test]
fn sizes_are_read_spaced_or_comma_separated_and_checked_before_any_measurement() {
    for args in [
        &["bench", "--sizes", "1", "0"][..],
        &["bench", "--sizes", "1,0"],
        &["bench", "--sizes", "5000"],
    ] {
        let out = output(args);
        assert!(!out.status.success(), "{args:?}");
        let err = stderr(&out);
        assert!(
            err.contains("--sizes takes MB values in 1..=4096"),
            "{args:?}: {err}"
        );
    }
}
