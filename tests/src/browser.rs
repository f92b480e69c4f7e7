//! A headless Chromium driven through chromedriver's WebDriver protocol
//! (Debian's `chromium` and `chromium-driver`, which `scripts/setup-host`
//! installs), for the tests of the coordinator's web view.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use base64::Engine;
use serde_json::{json, Value};

use crate::{free_port, wait_for};

/// How long chromedriver may take to start.
const START: std::time::Duration = std::time::Duration::from_secs(60);

/// The W3C WebDriver element key.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A chromedriver process and one browser session; both end on drop.
pub struct Browser {
    driver: Child,
    base: String,
    session: String,
    rt: tokio::runtime::Runtime,
    http: reqwest::Client,
}

impl Browser {
    /// Starts chromedriver and a headless Chromium that accepts the test
    /// coordinator's certificate (its CA is not in the system store).
    pub fn start() -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let port = free_port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect(
                "chromedriver (Debian package chromium-driver; scripts/setup-host installs it)",
            );
        let rt = tokio::runtime::Runtime::new().unwrap();
        let http = reqwest::Client::new();
        let base = format!("http://127.0.0.1:{port}");
        let mut b = Self {
            driver,
            base,
            session: String::new(),
            rt,
            http,
        };
        wait_for("chromedriver to be ready", START, || {
            let s = b.call("GET", "/status", None)?;
            (s["ready"] == true).then_some(()).ok_or(format!("{s}"))
        });
        let created = b
            .call(
                "POST",
                "/session",
                Some(json!({"capabilities": {"alwaysMatch": {
                    "browserName": "chrome",
                    "acceptInsecureCerts": true,
                    "goog:chromeOptions": {
                        "binary": "/usr/bin/chromium",
                        "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                                 "--disable-dev-shm-usage", "--window-size=1280,900"]
                    }
                }}})),
            )
            .expect("a Chromium session");
        b.session = created["sessionId"].as_str().expect("sessionId").to_owned();
        b
    }

    /// One WebDriver call; its `value`, or the error it names.
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, String> {
        let url = format!("{}{path}", self.base);
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let req = self.http.request(method, url);
        let req = match body {
            Some(b) => req.json(&b),
            None => req,
        };
        let v: Value = self
            .rt
            .block_on(async { req.send().await?.json().await })
            .map_err(|e| e.to_string())?;
        let value = v["value"].clone();
        if let Some(e) = value.get("error") {
            return Err(format!("{e}: {}", value["message"]));
        }
        Ok(value)
    }

    fn session_call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, String> {
        self.call(method, &format!("/session/{}{path}", self.session), body)
    }

    /// Opens `url`.
    pub fn go(&self, url: &str) {
        self.session_call("POST", "/url", Some(json!({ "url": url })))
            .unwrap_or_else(|e| panic!("open {url}: {e}"));
    }

    /// The page's URL now.
    pub fn url(&self) -> String {
        self.session_call("GET", "/url", None)
            .unwrap()
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// Waits until the page's URL ends with `suffix` (after a click that
    /// submits a form, the navigation may still be under way).
    pub fn wait_url(&self, suffix: &str) {
        wait_for(&format!("the browser at …{suffix}"), START, || {
            let url = self.url();
            url.ends_with(suffix).then_some(()).ok_or(url)
        });
    }

    /// The page's HTML as the browser holds it.
    pub fn source(&self) -> String {
        self.session_call("GET", "/source", None)
            .unwrap()
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// The elements matching a CSS selector.
    pub fn find_all(&self, css: &str) -> Vec<String> {
        self.session_call(
            "POST",
            "/elements",
            Some(json!({"using": "css selector", "value": css})),
        )
        .unwrap_or_else(|e| panic!("find {css}: {e}"))
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e[ELEMENT].as_str().unwrap().to_owned())
        .collect()
    }

    /// The one element matching a CSS selector.
    pub fn find(&self, css: &str) -> String {
        let v = self
            .session_call(
                "POST",
                "/element",
                Some(json!({"using": "css selector", "value": css})),
            )
            .unwrap_or_else(|e| panic!("find {css} on {}: {e}", self.url()));
        v[ELEMENT].as_str().unwrap().to_owned()
    }

    /// An element's visible text.
    pub fn text(&self, element: &str) -> String {
        self.session_call("GET", &format!("/element/{element}/text"), None)
            .unwrap()
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// The visible text of the element a CSS selector finds.
    pub fn text_of(&self, css: &str) -> String {
        self.text(&self.find(css))
    }

    /// An element's attribute.
    pub fn attribute(&self, element: &str, name: &str) -> Option<String> {
        self.session_call("GET", &format!("/element/{element}/attribute/{name}"), None)
            .unwrap()
            .as_str()
            .map(str::to_owned)
    }

    /// Types into an element.
    pub fn type_into(&self, css: &str, text: &str) {
        let e = self.find(css);
        self.session_call("POST", &format!("/element/{e}/clear"), Some(json!({})))
            .unwrap();
        self.session_call(
            "POST",
            &format!("/element/{e}/value"),
            Some(json!({ "text": text })),
        )
        .unwrap();
    }

    /// Clicks an element.
    pub fn click(&self, css: &str) {
        let e = self.find(css);
        self.session_call("POST", &format!("/element/{e}/click"), Some(json!({})))
            .unwrap();
    }

    /// A cookie's value.
    pub fn cookie(&self, name: &str) -> Option<String> {
        self.session_call("GET", &format!("/cookie/{name}"), None)
            .ok()
            .and_then(|c| c["value"].as_str().map(str::to_owned))
    }

    /// Saves a screenshot of the window as `name`.png under
    /// `target/test-artifacts/ui/`; returns its path.
    pub fn screenshot(&self, name: &str) -> PathBuf {
        let b64 = self.session_call("GET", "/screenshot", None).unwrap();
        let png = base64::engine::general_purpose::STANDARD
            .decode(b64.as_str().unwrap())
            .unwrap();
        let dir = artifacts_dir().join("ui");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap();
        path
    }
}

/// Where tests leave what a person may want to look at afterwards.
pub fn artifacts_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"))
        .join("test-artifacts")
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = self.session_call("DELETE", "", None);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
