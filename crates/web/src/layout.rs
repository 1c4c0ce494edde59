//! The frame around every page: head, navigation, language switch,
//! flash message.

use maud::{html, Markup, DOCTYPE};

use super::i18n::Lang;
use super::flash::Flash;
use super::{csrf_field, Ctx};

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Nav {
    Nodes,
    Apps,
    /// Managed databases and volumes.
    Data,
    Monitoring,
    Alerts,
    Audit,
}

/// Every page's `<head>`. The doctype is not part of it: it must come
/// before `<html>`, since anything ahead of it puts browsers in quirks mode.
fn head(lang: Lang, title: &str) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            meta name="viewport" content="width=device-width, initial-scale=1";
            title { (title) " · " (lang.t("product")) }
            link rel="stylesheet" href="/assets/app.css";
            script src="/assets/app.js" defer {}
        }
    }
}

/// A full page. `here` is the page's own path, for the language switch
/// to come back to.
pub fn page(ctx: &Ctx, title: &str, nav: Nav, here: &str, body: Markup) -> Markup {
    let link = |target: Nav, href: &str, key: &'static str| {
        html! { a href=(href) aria-current=[(target == nav).then_some("page")] { (ctx.lang.t(key)) } }
    };
    html! {
        (DOCTYPE)
        html lang=(ctx.lang.code()) {
            (head(ctx.lang, title))
            body {
                a.skip href="#main" { (ctx.t("nav.skip")) }
                header.top {
                    strong.brand { (ctx.t("product")) }
                    nav {
                        @if ctx.access.cluster.is_some() { (link(Nav::Nodes, "/nodes", "nav.nodes")) }
                        (link(Nav::Apps, "/apps", "nav.apps"))
                        (link(Nav::Data, "/services", "nav.data"))
                        @if ctx.access.cluster.is_some() { (link(Nav::Monitoring, "/monitoring", "nav.monitoring")) }
                        @if ctx.access.cluster.is_some() || ctx.access.grants.iter().any(|g| g.role == cloudweb_core::access::TeamRole::Owner) {
                            (link(Nav::Audit, "/audit", "nav.audit"))
                        }
                        @if ctx.access.cluster.is_some() { a.bell href="/alerts" id="alerts-bell" aria-current=[(nav == Nav::Alerts).then_some("page")] title=(ctx.t("nav.alerts")) {
                            "🔔 " (ctx.t("nav.alerts"))
                            @if ctx.open_alerts > 0 { " " span.count aria-label=(ctx.t("alerts.open")) { (ctx.open_alerts) } }
                        } }
                    }
                    // On a narrow screen the script folds these behind
                    // the button, so the header stays one row.
                    button.menu type="button" aria-expanded="false" aria-controls="header-more" aria-label=(ctx.t("nav.menu")) title=(ctx.t("nav.menu")) { "☰" }
                    div.more id="header-more" {
                        form.lang method="post" action="/lang" {
                            input type="hidden" name="back" value=(here);
                            label for="lang-select" { (ctx.t("nav.language")) }
                            select id="lang-select" name="lang" {
                                option value="en" selected[ctx.lang == Lang::En] { "English" }
                                option value="es" selected[ctx.lang == Lang::Es] { "Español" }
                            }
                            button type="submit" { (ctx.t("nav.switch")) }
                        }
                        @if ctx.access.grants.len() > 1 {
                            form.lang method="post" action="/team" {
                                (csrf_field(ctx))
                                input type="hidden" name="back" value=(here);
                                label for="team-select" { (ctx.t("nav.team")) }
                                select id="team-select" name="team" {
                                    @for grant in &ctx.access.grants {
                                        option value=(grant.team_name) selected[ctx.current_team.as_deref() == Some(grant.team_name.as_str())] { (grant.team_name) }
                                    }
                                }
                                button type="submit" { (ctx.t("nav.switch")) }
                            }
                        }
                        form.logout method="post" action="/logout" {
                            (csrf_field(ctx))
                            span.user { (ctx.user_name) } " "
                            button type="submit" { (ctx.t("nav.logout")) }
                        }
                    }
                }
                main id="main" {
                    @if !ctx.backup_alerts.is_empty() {
                        div.flash.error id="backup-banner" role="alert" {
                            a href="/backups" { (ctx.t("backups.banner")) }
                            ul { @for alert in &ctx.backup_alerts { li { (alert) } } }
                        }
                    }
                    h1 { (title) }
                    (flash(ctx))
                    (body)
                }
            }
        }
    }
}

fn flash(ctx: &Ctx) -> Markup {
    match &ctx.flash {
        None => html! {},
        Some(Flash::Done) => html! { p.flash.ok role="status" { (ctx.t("common.done")) } },
        Some(Flash::Error(text)) => html! { p.flash.error role="alert" { strong { (ctx.t("common.error")) ": " } (text) } },
        Some(Flash::JoinCommand { command, expires_at }) => html! {
            section.flash.ok role="status" id="join" {
                p { (ctx.t("nodes.join_command")) }
                pre.command { code id="join-command" { (command) } }
                button type="button" class="copy" data-copy="join-command" hidden { (ctx.t("common.copy")) }
                p { (ctx.t("nodes.join_expires")) " " time { (expires_at) } }
            }
        },
        Some(Flash::Waiting(apps)) => html! {
            section.flash.error role="alert" {
                p { (ctx.t("nodes.waiting")) }
                ul { @for (app, reason) in apps { li { strong { (app) } ": " (reason) } } }
            }
        },
    }
}

/// A page with just a message (errors, not found).
pub fn message(ctx: &Ctx, text: &str) -> Markup {
    html! {
        (DOCTYPE)
        html lang=(ctx.lang.code()) {
            (head(ctx.lang, text))
            body { main id="main" { p { (text) } p { a href="/nodes" { (ctx.t("common.back")) } } } }
        }
    }
}

/// A git host the login page offers ("Log in with GitHub"): its name and
/// the API route that starts its login.
pub struct LoginHost {
    pub label: &'static str,
    pub href: &'static str,
}

pub fn login(lang: Lang, error: Option<&str>, hosts: &[LoginHost]) -> Markup {
    html! {
        (DOCTYPE)
        html lang=(lang.code()) {
            (head(lang, lang.t("login.title")))
            body.login {
                main id="main" {
                    h1 { (lang.t("product")) }
                    form method="post" action="/login" {
                        @if let Some(error) = error { p.flash.error role="alert" { (error) } }
                        label for="name" { (lang.t("login.name")) }
                        input id="name" name="name" autocomplete="username" maxlength="64" required autofocus;
                        label for="password" { (lang.t("login.password")) }
                        input id="password" name="password" type="password" autocomplete="current-password" required;
                        p.help { (with_code(lang.t("login.help"), &[("{command}", "cloudweb-server admin create-user"), ("{api}", "POST /api/users")])) }
                        button type="submit" { (lang.t("login.submit")) }
                    }
                    @if !hosts.is_empty() {
                        ul.login-hosts {
                            @for host in hosts {
                                li { a.button href=(host.href) { (lang.t("login.with").replace("{host}", host.label)) } }
                            }
                        }
                    }
                    form.lang method="post" action="/lang" {
                        input type="hidden" name="back" value="/login";
                        label for="lang-select" { (lang.t("nav.language")) }
                        select id="lang-select" name="lang" {
                            option value="en" selected[lang == Lang::En] { "English" }
                            option value="es" selected[lang == Lang::Es] { "Español" }
                        }
                        button type="submit" { (lang.t("nav.switch")) }
                    }
                }
            }
        }
    }
}

/// `text` with each placeholder replaced by its value set as code (the
/// catalogue holds words only; commands are not translated).
fn with_code(text: &str, code: &[(&str, &str)]) -> Markup {
    let mut rest = text;
    let mut out = String::new();
    while let Some((at, placeholder, value)) = code.iter().filter_map(|(p, v)| rest.find(p).map(|at| (at, *p, *v))).min_by_key(|f| f.0) {
        out.push_str(&html! { (&rest[..at]) code { (value) } }.into_string());
        rest = &rest[at + placeholder.len()..];
    }
    out.push_str(&html! { (rest) }.into_string());
    maud::PreEscaped(out)
}

/// A confirmation page at `here`: the question, and a form that posts back
/// to `here`.
pub fn confirm(ctx: &Ctx, title: &str, nav: Nav, here: &str, question: &str, extra: Markup, cancel_to: &str) -> Markup {
    page(
        ctx,
        title,
        nav,
        here,
        html! {
            form.confirm method="post" action=(here) {
                (csrf_field(ctx))
                p { (question) }
                (extra)
                button.danger type="submit" { (ctx.t("common.confirm")) }
                " "
                a href=(cancel_to) { (ctx.t("common.cancel")) }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_doctype_comes_before_html() {
        for lang in [Lang::En, Lang::Es] {
            let page = login(lang, Some("<b>"), &[]).into_string();
            assert!(page.starts_with(&format!("<!DOCTYPE html><html lang=\"{}\"><head>", lang.code())), "{page}");
            assert!(page.contains("&lt;b&gt;"), "still escaped: {page}");
        }
    }

    #[test]
    fn the_login_help_shows_code_not_backticks() {
        for lang in [Lang::En, Lang::Es] {
            let page = login(lang, None, &[]).into_string();
            assert!(!page.contains('`') && page.contains("<code>cloudweb-server admin create-user</code>") && page.contains("<code>POST /api/users</code>"), "{page}");
        }
        assert_eq!(with_code("a {x} b {y}{x}", &[("{x}", "<1>"), ("{y}", "2")]).into_string(), "a <code>&lt;1&gt;</code> b <code>2</code><code>&lt;1&gt;</code>");
        assert_eq!(with_code("<none>", &[("{x}", "1")]).into_string(), "&lt;none&gt;");
    }
}
