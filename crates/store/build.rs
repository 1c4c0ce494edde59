//! Rebuilds the crate when a migration changes: `sqlx::migrate!` embeds
//! the files at compile time, and a new file alone would not trigger it.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
