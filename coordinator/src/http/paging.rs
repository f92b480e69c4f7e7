//! Lists in pages, as the Kubernetes API pages them: `?limit=N` returns at
//! most N objects and, when more follow, a `continue` token for the next
//! page. The body stays a JSON array (clients that do not page are
//! unchanged); the next page's URL is in a `Link: <…>; rel="next"` header
//! (RFC 8288), and the token alone in `Drover-Continue`.
//!
//! A page is read from the store from the first name after the token's
//! (SQLite: one indexed range; etcd: one key range), so it costs what it
//! returns, not the whole list. Pages are not one snapshot: an object
//! created or deleted between two pages shows, or not, by where its name
//! falls; none is listed twice and none that lived throughout is missed.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRequestParts, Query};
use axum::http::request::Parts;
use axum::http::{HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::{Deserialize, Serialize};

use super::error::ApiError;
use crate::app::App;
use crate::store::{Span, StoreError};

/// The most objects one page may ask for.
pub const MAX_LIMIT: usize = 10_000;

pub use drover_common::CONTINUE_HEADER;

/// What a list call asks for.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// The most objects to return, 1 to 10,000; absent or 0: every object.
    /// When more follow, the answer names the next page (`Link` and
    /// `Drover-Continue` headers).
    pub limit: Option<usize>,
    /// The token of the page to return, from the previous page's
    /// `Drover-Continue` header; absent: the first page.
    #[serde(rename = "continue")]
    #[param(rename = "continue")]
    pub continue_: Option<String>,
}

/// A page as the store reads it: names after `after`, at most `limit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    pub after: String,
    pub limit: Option<usize>,
}

impl Page {
    /// How many objects to read: one more than the page holds, to know
    /// whether another page follows.
    pub fn read_limit(&self) -> Option<usize> {
        self.limit.map(|n| n + 1)
    }

    /// Reads the page (and one more object) with `list`, off the async
    /// workers.
    pub async fn read<T: Send + 'static>(
        &self,
        app: &Arc<App>,
        list: fn(&App, Span<'_>) -> Result<Vec<T>, StoreError>,
    ) -> Result<Vec<T>, ApiError> {
        let (app, page) = (app.clone(), self.clone());
        Ok(crate::store::blocking(move || {
            let span = Span {
                after: &page.after,
                limit: page.read_limit(),
            };
            list(&app, span)
        })
        .await?)
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Page {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let query: Result<Query<ListQuery>, QueryRejection> =
            Query::from_request_parts(parts, state).await;
        // A malformed query is refused with a problem document, like every other.
        let Query(q) = query.map_err(|r| ApiError::bad_request(r.body_text()))?;
        q.page()
    }
}

impl ListQuery {
    /// The page asked for, or why the query is refused.
    pub fn page(&self) -> Result<Page, ApiError> {
        let limit = match self.limit {
            None | Some(0) => None,
            Some(n) if n > MAX_LIMIT => {
                return Err(ApiError::bad_request(format!(
                    "limit {n} is over {MAX_LIMIT}: ask for at most {MAX_LIMIT} objects a page and follow the continue token"
                )))
            }
            Some(n) => Some(n),
        };
        let after = match &self.continue_ {
            None => String::new(),
            Some(token) => decode_token(token).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "continue token {token:?} is not one this coordinator gives: list again from the first page (without `continue`)"
                ))
            })?,
        };
        Ok(Page { after, limit })
    }
}

/// The token for the page after the object named `last`.
pub(crate) fn encode_token(last: &str) -> String {
    URL_SAFE_NO_PAD.encode(last)
}

/// The name a token continues after, if it is one [`encode_token`] made
/// (of a valid object name).
fn decode_token(token: &str) -> Option<String> {
    let bytes = URL_SAFE_NO_PAD.decode(token).ok()?;
    let name = String::from_utf8(bytes).ok()?;
    drover_common::names::check_object_name("a continue token", &name).ok()?;
    Some(name)
}

/// The answer to one page of `path`: `items` as read with
/// [`Page::read_limit`], cut to the page, with the next page's headers
/// when more follow.
pub fn answer<T: Serialize>(
    path: &str,
    page: &Page,
    mut items: Vec<T>,
    name_of: impl Fn(&T) -> &str,
) -> Response {
    let next = match page.limit {
        Some(limit) if items.len() > limit => {
            items.truncate(limit);
            items
                .last()
                .map(|last| (limit, encode_token(name_of(last))))
        }
        _ => None,
    };
    let mut response = Json(items).into_response();
    if let Some((limit, token)) = next {
        let headers = response.headers_mut();
        let link = format!("<{path}?limit={limit}&continue={token}>; rel=\"next\"");
        // The token is base64url and the path is the route's own: both are
        // valid header text.
        if let (Ok(link), Ok(token)) = (HeaderValue::from_str(&link), HeaderValue::from_str(&token))
        {
            headers.insert(axum::http::header::LINK, link);
            headers.insert(HeaderName::from_static(CONTINUE_HEADER), token);
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(limit: Option<usize>, token: Option<&str>) -> ListQuery {
        ListQuery {
            limit,
            continue_: token.map(str::to_owned),
        }
    }

    #[test]
    fn a_token_names_the_object_the_next_page_follows() {
        let token = encode_token("web-7");
        let page = query(Some(2), Some(&token)).page().unwrap();
        assert_eq!(page.after, "web-7");
        assert_eq!(page.read_limit(), Some(3));
        assert_eq!(query(None, None).page().unwrap().limit, None);
        assert_eq!(query(Some(0), None).page().unwrap().limit, None);
    }

    #[test]
    fn a_bad_limit_or_token_is_refused_saying_what_to_do() {
        for (q, want) in [
            (
                query(Some(MAX_LIMIT + 1), None),
                "limit 10001 is over 10000",
            ),
            (query(None, Some("!!")), "list again from the first page"),
            // Base64 of a name no object can have.
            (
                query(None, Some(&URL_SAFE_NO_PAD.encode("../x"))),
                "is not one this coordinator gives",
            ),
        ] {
            let e = q.page().unwrap_err().detail;
            assert!(e.contains(want), "{e}");
        }
    }

    #[test]
    fn a_full_page_names_the_next_and_the_last_page_does_not() {
        let page = Page {
            after: String::new(),
            limit: Some(2),
        };
        let more = answer("/v1/clusters", &page, vec!["a", "b", "c"], |s| s);
        let link = more.headers()[axum::http::header::LINK].to_str().unwrap();
        let token = more.headers()[CONTINUE_HEADER].to_str().unwrap();
        assert_eq!(decode_token(token).as_deref(), Some("b"));
        assert_eq!(
            link,
            format!("</v1/clusters?limit=2&continue={token}>; rel=\"next\"")
        );
        let last = answer("/v1/clusters", &page, vec!["c"], |s| s);
        assert!(last.headers().get(axum::http::header::LINK).is_none());
        let all = answer(
            "/v1/clusters",
            &Page {
                after: String::new(),
                limit: None,
            },
            vec!["a", "b", "c"],
            |s| s,
        );
        assert!(all.headers().get(CONTINUE_HEADER).is_none());
    }
}
