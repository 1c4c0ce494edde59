//! What the permission step reads on every request, kept for two seconds:
//! a user's memberships and an app's team. Changes made through this
//! replica forget the entries they touch at once; another replica's
//! changes reach this one within [`TTL`]. A disabled user's or revoked
//! token's requests stop at once either way: authentication reads the
//! database on every request.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::store::MemberRow;

/// How long an entry is trusted.
pub const TTL: Duration = Duration::from_secs(2);
/// Past this many entries a map is emptied (it refills from the database).
const MAX_ENTRIES: usize = 10_000;

#[derive(Default)]
pub struct Cache {
    memberships: Mutex<HashMap<String, (Instant, Vec<MemberRow>)>>,
    app_teams: Mutex<HashMap<String, (Instant, String)>>,
}

fn fresh<T: Clone>(map: &Mutex<HashMap<String, (Instant, T)>>, key: &str) -> Option<T> {
    let map = map.lock().expect("access cache lock");
    map.get(key).filter(|(at, _)| at.elapsed() < TTL).map(|(_, value)| value.clone())
}

fn keep<T>(map: &Mutex<HashMap<String, (Instant, T)>>, key: &str, value: T) {
    let mut map = map.lock().expect("access cache lock");
    if map.len() >= MAX_ENTRIES {
        map.clear();
    }
    map.insert(key.to_string(), (Instant::now(), value));
}

impl Cache {
    pub fn memberships(&self, user_id: &str) -> Option<Vec<MemberRow>> {
        fresh(&self.memberships, user_id)
    }

    pub fn keep_memberships(&self, user_id: &str, rows: Vec<MemberRow>) {
        keep(&self.memberships, user_id, rows);
    }

    pub fn app_team(&self, app: &str) -> Option<String> {
        fresh(&self.app_teams, app)
    }

    pub fn keep_app_team(&self, app: &str, team_id: String) {
        keep(&self.app_teams, app, team_id);
    }

    /// A user's memberships changed.
    pub fn forget_user(&self, user_id: &str) {
        self.memberships.lock().expect("access cache lock").remove(user_id);
    }

    /// An app was made (its name may have had another team before).
    pub fn forget_app(&self, app: &str) {
        self.app_teams.lock().expect("access cache lock").remove(app);
    }

    /// A team went: every membership may have changed.
    pub fn forget_all(&self) {
        self.memberships.lock().expect("access cache lock").clear();
        self.app_teams.lock().expect("access cache lock").clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_forgotten_when_told_and_when_old() {
        let cache = Cache::default();
        cache.keep_app_team("web", "team_a".into());
        assert_eq!(cache.app_team("web").as_deref(), Some("team_a"));
        cache.forget_app("web");
        assert_eq!(cache.app_team("web"), None);
        cache.keep_memberships("usr_a", Vec::new());
        assert_eq!(cache.memberships("usr_a"), Some(Vec::new()));
        cache.forget_all();
        assert_eq!(cache.memberships("usr_a"), None);
        cache.app_teams.lock().unwrap().insert("old".into(), (Instant::now() - TTL, "team_a".into()));
        assert_eq!(cache.app_team("old"), None, "past the TTL");
    }
}
