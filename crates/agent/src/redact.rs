//! Keeping an app's secrets out of what the agent ships. An app that fails
//! often prints its configuration, and its last output lines are stored by
//! the control plane: every line (and failure message) the agent sends about
//! a deployment has the values of the app's variables replaced by
//! `[redacted NAME]` first.
//!
//! Values shorter than [`MIN_SECRET_LEN`] characters are left alone: such a
//! value (`1`, `on`, `dev`) is no secret, and replacing it would garble
//! every line that happens to contain those letters.

use std::collections::BTreeMap;

/// Shortest value that is redacted.
pub const MIN_SECRET_LEN: usize = 4;

#[derive(Debug, Clone, Default)]
pub struct Redactor {
    /// (value, name), longest value first, so a value that contains another
    /// is replaced whole.
    secrets: Vec<(String, String)>,
}

impl Redactor {
    pub fn new(env: &BTreeMap<String, String>) -> Redactor {
        let mut secrets: Vec<(String, String)> =
            env.iter().filter(|(_, value)| value.chars().count() >= MIN_SECRET_LEN).map(|(name, value)| (value.clone(), name.clone())).collect();
        secrets.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.1.cmp(&b.1)));
        Redactor { secrets }
    }

    pub fn apply(&self, text: &str) -> String {
        let mut text = text.to_string();
        for (value, name) in &self.secrets {
            if text.contains(value.as_str()) {
                text = text.replace(value.as_str(), &format!("[redacted {name}]"));
            }
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_replaced_by_their_names() {
        let env = BTreeMap::from([
            ("DATABASE_PASSWORD".to_string(), "p4ss".to_string()),
            ("TOKEN".to_string(), "p4ss-and-more".to_string()),
            ("DEBUG".to_string(), "1".to_string()),
        ]);
        let redactor = Redactor::new(&env);
        assert_eq!(
            redactor.apply("pw=p4ss token=p4ss-and-more debug=1"),
            "pw=[redacted DATABASE_PASSWORD] token=[redacted TOKEN] debug=1"
        );
        assert_eq!(Redactor::new(&BTreeMap::new()).apply("nothing"), "nothing");
    }
}
