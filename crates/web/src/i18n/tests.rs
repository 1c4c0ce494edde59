//! The catalogues' tests.

use std::collections::BTreeSet;

use super::*;

#[test]
fn both_catalogues_have_the_same_keys_and_no_duplicates() {
    let en: BTreeSet<&str> = EN.iter().map(|(k, _)| *k).collect();
    let es: BTreeSet<&str> = ES.iter().map(|(k, _)| *k).collect();
    assert_eq!(en.len(), EN.len(), "a key appears twice in the English catalogue");
    assert_eq!(es.len(), ES.len(), "a key appears twice in the Spanish catalogue");
    let only_en: Vec<_> = en.difference(&es).collect();
    let only_es: Vec<_> = es.difference(&en).collect();
    assert!(only_en.is_empty() && only_es.is_empty(), "only in English: {only_en:?}; only in Spanish: {only_es:?}");
    assert!(EN.iter().chain(ES).all(|(_, v)| !v.trim().is_empty()), "an empty translation");
}

#[test]
fn every_key_the_pages_use_is_in_the_catalogue() {
    // The pages name keys as string literals `t("…")`; scan the sources
    // so a typo cannot render as a raw key.
    let keys: BTreeSet<&str> = EN.iter().map(|(k, _)| *k).collect();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "rs") || path.ends_with("i18n.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for piece in text.split(".t(\"").skip(1) {
            let key = &piece[..piece.find('"').unwrap()];
            assert!(keys.contains(key), "{} uses unknown key {key:?}", path.display());
        }
    }
}

/// Markup in a catalogue would show as typed (pages escape every word),
/// and a Spanish word left in English is a missed translation: only
/// these are the same in both languages.
#[test]
fn catalogues_hold_plain_words_and_spanish_translates_them() {
    const SAME_IN_BOTH: &[&str] = &[
        "product", "nav.apps", "apps.title", "mon.apps", "nodes.cpu", "mon.cpu", "apps.url", "apps.strategy.dockerfile",
        "apps.strategy.buildpacks", "deploy.commit", "deploy.error", "common.error", "common.no", "volumes.app", "planes.url", "term.title", "alerts.personal",
    ];
    for (key, value) in EN.iter().chain(ES) {
        assert!(!value.contains('`') && !value.contains('<'), "{key}: markup in {value:?}");
    }
    let english: HashMap<&str, &str> = EN.iter().copied().collect();
    for (key, value) in ES {
        if english.get(key) == Some(value) {
            assert!(SAME_IN_BOTH.contains(key), "{key} is not translated: {value:?}");
        }
    }
    assert_eq!(Lang::Es.t("nodes.ingress"), "entrada");
}

#[test]
fn accept_language_picks_the_best_language_we_speak() {
    let check = |header: &str, want: Lang| assert_eq!(Lang::from_accept_language(header), want, "{header}");
    check("es-ES,es;q=0.9,en;q=0.8", Lang::Es);
    check("en-US,en;q=0.9,es;q=0.8", Lang::En);
    check("fr-FR,fr;q=0.9,es;q=0.5", Lang::Es);
    check("de, en;q=0.1, es;q=0.4", Lang::Es);
    check("es;q=0", Lang::En);
    check("", Lang::En);
    check("*", Lang::En);
    assert_eq!(Lang::Es.t("health.healthy"), "sana");
    assert_eq!(Lang::Es.t("health.mesh"), "malla");
    assert_eq!(Lang::Es.t("nodes.join_token"), "Generar token de unión");
}
