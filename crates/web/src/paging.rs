//! Long lists (nodes, apps) shown a page at a time, with a search box and
//! an optional filter, so a page stays small however large the cluster
//! grows (issue 21 item 5: every page under 150 KB at 1,000 nodes and
//! 1,000 apps). Everything is in the query string, so a filtered page can
//! be bookmarked and works without the script.

use maud::{html, Markup};

use super::Ctx;

/// Rows per page.
pub const PER_PAGE: usize = 50;
/// The longest search text kept.
const MAX_QUERY: usize = 100;

/// `?q=…&filter=…&page=…` of a list page.
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct ListQuery {
    pub q: Option<String>,
    pub filter: Option<String>,
    pub page: Option<String>,
    /// The live table's stream is told the page's language this way.
    pub lang: Option<String>,
}

impl ListQuery {
    /// The search text, trimmed and bounded; `None` when empty.
    pub fn search(&self) -> Option<String> {
        let q = self.q.as_deref()?.trim();
        (!q.is_empty()).then(|| q.chars().take(MAX_QUERY).collect::<String>().to_lowercase())
    }

    /// The filter when it is one of `known`, else `None` (all rows).
    pub fn filter<'a>(&self, known: &[&'a str]) -> Option<&'a str> {
        let wanted = self.filter.as_deref()?;
        known.iter().copied().find(|k| *k == wanted)
    }

    /// The 1-based page asked for (1 when absent or not a number).
    pub fn page(&self) -> usize {
        self.page.as_deref().and_then(|p| p.parse::<usize>().ok()).filter(|p| *p >= 1).unwrap_or(1)
    }

    /// The query string of the same list at `page` (no leading `?`).
    pub fn at_page(&self, page: usize) -> String {
        let mut query = url::form_urlencoded::Serializer::new(String::new());
        if let Some(q) = self.q.as_deref().map(str::trim).filter(|q| !q.is_empty()) {
            query.append_pair("q", q);
        }
        if let Some(filter) = self.filter.as_deref().filter(|f| !f.is_empty()) {
            query.append_pair("filter", filter);
        }
        if page > 1 {
            query.append_pair("page", &page.to_string());
        }
        query.finish()
    }
}

/// Whether `text` contains the search (case-insensitively).
pub fn matches(search: Option<&str>, texts: &[&str]) -> bool {
    match search {
        None => true,
        Some(search) => texts.iter().any(|t| t.to_lowercase().contains(search)),
    }
}

/// Where one page sits in a filtered list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageInfo {
    /// 1-based, within `1..=pages`.
    pub page: usize,
    pub pages: usize,
    pub total: usize,
    /// Index of the first row shown in the whole list.
    pub first: usize,
    /// Rows on this page.
    pub shown: usize,
}

/// One page of a filtered list.
pub struct Paged<'a, T> {
    pub rows: &'a [T],
    pub info: PageInfo,
}

/// The `page`th page of `rows` (the last page when past the end).
pub fn page_of<T>(rows: &[T], page: usize) -> Paged<'_, T> {
    let total = rows.len();
    let pages = total.div_ceil(PER_PAGE).max(1);
    let page = page.clamp(1, pages);
    let first = ((page - 1) * PER_PAGE).min(total);
    let end = (first + PER_PAGE).min(total);
    Paged { rows: &rows[first..end], info: PageInfo { page, pages, total, first, shown: end - first } }
}

/// The search form of a list at `action`, with the filter's choices
/// (value, label) when it has any.
pub fn search_form(ctx: &Ctx, action: &str, query: &ListQuery, filters: &[(&str, &str)]) -> Markup {
    let current = query.filter.as_deref().unwrap_or("");
    html! {
        form.search method="get" action=(action) role="search" {
            label for="list-q" { (ctx.t("list.search")) }
            input id="list-q" type="search" name="q" maxlength=(MAX_QUERY) value=(query.q.as_deref().unwrap_or(""));
            @if !filters.is_empty() {
                label for="list-filter" { (ctx.t("list.show")) }
                select id="list-filter" name="filter" {
                    option value="" selected[current.is_empty()] { (ctx.t("list.all")) }
                    @for (value, label) in filters {
                        option value=(value) selected[current == *value] { (label) }
                    }
                }
            }
            button type="submit" { (ctx.t("list.apply")) }
        }
    }
}

/// "Showing 51–100 of 1000" and the links to the other pages.
pub fn pager(ctx: &Ctx, action: &str, query: &ListQuery, paged: &PageInfo) -> Markup {
    let link = |page: usize| {
        let qs = query.at_page(page);
        if qs.is_empty() {
            action.to_string()
        } else {
            format!("{action}?{qs}")
        }
    };
    let shown = if paged.total == 0 {
        ctx.t("list.none").to_string()
    } else {
        ctx.t("list.showing")
            .replace("{from}", &(paged.first + 1).to_string())
            .replace("{to}", &(paged.first + paged.shown).to_string())
            .replace("{total}", &paged.total.to_string())
    };
    html! {
        nav.pager aria-label=(ctx.t("list.pages")) data-total=(paged.total) data-page=(paged.page) data-pages=(paged.pages) {
            span { (shown) }
            @if paged.page > 1 {
                " " a rel="prev" href=(link(paged.page - 1)) { (ctx.t("list.previous")) }
            }
            @if paged.pages > 1 {
                " " span { (ctx.t("list.page").replace("{page}", &paged.page.to_string()).replace("{pages}", &paged.pages.to_string())) }
            }
            @if paged.page < paged.pages {
                " " a rel="next" href=(link(paged.page + 1)) { (ctx.t("list.next")) }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_are_bounded_and_the_query_survives_paging() {
        let rows: Vec<usize> = (0..120).collect();
        let first = page_of(&rows, 1);
        assert_eq!((first.rows.len(), first.info.pages, first.info.first, first.info.total), (50, 3, 0, 120));
        let last = page_of(&rows, 3);
        assert_eq!((last.rows.len(), last.rows[0], last.info.shown), (20, 100, 20));
        // Past the end: the last page, not an empty one.
        assert_eq!(page_of(&rows, 99).info.page, 3);
        let none = page_of(&Vec::<usize>::new(), 1).info;
        assert_eq!((none.pages, none.total, none.shown), (1, 0, 0));
        let query = ListQuery { q: Some(" web & co ".into()), filter: Some("ready".into()), page: Some("2".into()), lang: None };
        assert_eq!(query.page(), 2);
        assert_eq!(query.search().as_deref(), Some("web & co"));
        assert_eq!(query.at_page(3), "q=web+%26+co&filter=ready&page=3");
        assert_eq!(query.at_page(1), "q=web+%26+co&filter=ready");
        assert_eq!(query.filter(&["ready", "draining"]), Some("ready"));
        assert_eq!(ListQuery { filter: Some("<x>".into()), ..Default::default() }.filter(&["ready"]), None);
        assert_eq!(ListQuery { page: Some("-1".into()), ..Default::default() }.page(), 1);
        assert!(matches(Some("edge"), &["Edge-1", "host"]));
        assert!(!matches(Some("edge"), &["core"]));
    }
}
