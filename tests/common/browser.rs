//! A headless Chromium of a test's own, driven through its ChromeDriver: Debian's
//! `/usr/bin/chromium` and `/usr/bin/chromedriver` (`browser/up` installs them; nothing here
//! downloads a browser).
//!
//! [`Browser::start`] runs `chromedriver --port=0` as a child in a process group of its own,
//! reads the port it took from its first lines, waits until `/status` says it is ready, and opens
//! a session with a fresh profile in a temporary directory of its own (also the browser's
//! `TMPDIR`). Dropping the [`Browser`] (also when the test panics) ends the session, kills the
//! driver's process group, the browser with it, and removes the directory; [`Browser::close`]
//! does the same, waiting for the session to end. Tests in parallel each start their own: no
//! fixed port, no fixed path.
//!
//! The helpers panic with what they looked for, so a test reads as the visitor's steps:
//! [`Browser::open`], [`Browser::find`] / [`Browser::try_find`] / [`Browser::count`],
//! [`Browser::text`], [`Browser::fill`], [`Browser::click`]; the keyboard alone with
//! [`Browser::press`], [`Browser::type_keys`] and [`Browser::tab_to`];
//! [`Browser::wait_for_path`], [`Browser::wait_for_text`], [`Browser::wait_for_text_in`],
//! [`Browser::alert`], [`Browser::unreached_by_tab`],
//! [`Browser::screenshot`]. [`Browser::client`] is the fantoccini client for anything else.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use fantoccini::actions::{InputSource, KeyAction, KeyActions};
use fantoccini::elements::Element;
use fantoccini::key::Key;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;

pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// The window every test's browser has, so screenshots are alike.
pub const WINDOW: (u32, u32) = (1280, 900);
/// How long the waiting helpers wait.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// The flags Chromium needs here: headless, as root, and quiet on a closed network (without the
/// background-networking ones it keeps calling Google's services).
const ARGS: &[&str] = &[
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--metrics-recording-only",
    "--password-store=basic",
];

/// The driver process and its process group (Chromium and its helpers are in it).
struct Driver {
    child: Child,
    port: u16,
    /// The session still open, when the browser was not closed (a test that panicked).
    session: Option<String>,
}

impl Drop for Driver {
    fn drop(&mut self) {
        // First ask the driver to end the session, so Chromium quits and the driver reaps it
        // (no async here: a plain request with a deadline).
        if let Some(session) = self.session.take() {
            end_session(self.port, &session);
        }
        // Then the whole group: chromedriver, the browser it started, the browser's helpers.
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A headless Chromium with a session open.
pub struct Browser {
    client: Client,
    driver: Driver,
    /// `profile/` (the user data) and `tmp/` (the driver's and the browser's `TMPDIR`).
    dir: tempfile::TempDir,
}

impl Browser {
    /// Starts a driver and a browser with a profile of its own.
    pub async fn start() -> Self {
        for path in [CHROMIUM, CHROMEDRIVER] {
            assert!(
                Path::new(path).exists(),
                "{path} is missing: run browser/up (it installs Debian's chromium and chromium-driver)"
            );
        }
        let dir = tempfile::Builder::new()
            .prefix("hookrelay-chromium-")
            .tempdir()
            .expect("a directory for the browser");
        let tmp = dir.path().join("tmp");
        std::fs::create_dir(&tmp).expect("the browser's TMPDIR");
        let (mut driver, port) = spawn_driver(&tmp);
        let url = format!("http://127.0.0.1:{port}");
        wait_until_ready(&url).await;

        let mut args: Vec<String> = ARGS.iter().map(|a| (*a).to_owned()).collect();
        args.push(format!(
            "--user-data-dir={}",
            dir.path().join("profile").display()
        ));
        args.push(format!("--window-size={},{}", WINDOW.0, WINDOW.1));
        let capabilities = json!({
            "browserName": "chrome",
            "pageLoadStrategy": "normal",
            // An alert a page opens stays open, for `alert()` to see, instead of being dismissed.
            "unhandledPromptBehavior": "ignore",
            "goog:chromeOptions": { "binary": CHROMIUM, "args": args },
        });
        let serde_json::Value::Object(capabilities) = capabilities else {
            unreachable!()
        };
        let client = ClientBuilder::rustls()
            .expect("a connector")
            .capabilities(capabilities)
            .connect(&url)
            .await
            .unwrap_or_else(|e| panic!("no browser session from chromedriver at {url}: {e}"));
        driver.session = client.session_id().await.ok().flatten();
        Self {
            client,
            driver,
            dir,
        }
    }

    /// The fantoccini client, for what the helpers do not cover.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The browser's profile directory (removed with the browser).
    pub fn profile(&self) -> std::path::PathBuf {
        self.dir.path().join("profile")
    }

    /// Navigates to `url` and waits for the page's load.
    pub async fn open(&self, url: &str) {
        self.client
            .goto(url)
            .await
            .unwrap_or_else(|e| panic!("opening {url}: {e}"));
    }

    /// The current URL.
    pub async fn url(&self) -> url::Url {
        self.client.current_url().await.expect("the current URL")
    }

    /// The current URL's path.
    pub async fn path(&self) -> String {
        self.url().await.path().to_owned()
    }

    /// The page's title.
    pub async fn title(&self) -> String {
        self.client.title().await.expect("the title")
    }

    /// The element `css` selects: the first, panicking when there is none.
    pub async fn find(&self, css: &str) -> Element {
        match self.client.find(Locator::Css(css)).await {
            Ok(element) => element,
            Err(e) => panic!(
                "no element {css} on {}: {e}\n{}",
                self.url().await,
                self.text().await
            ),
        }
    }

    /// The element `css` selects, if any.
    pub async fn try_find(&self, css: &str) -> Option<Element> {
        match self.client.find(Locator::Css(css)).await {
            Ok(element) => Some(element),
            Err(e) if e.is_no_such_element() => None,
            Err(e) => panic!("looking for {css}: {e}"),
        }
    }

    /// Every element `css` selects.
    pub async fn find_all(&self, css: &str) -> Vec<Element> {
        self.client
            .find_all(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("looking for {css}: {e}"))
    }

    /// How many elements `css` selects.
    pub async fn count(&self, css: &str) -> usize {
        self.find_all(css).await.len()
    }

    /// The page's visible text (its body's, as rendered: markup in data shows as text).
    pub async fn text(&self) -> String {
        match self.client.find(Locator::Css("body")).await {
            Ok(body) => body.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    /// The visible text of the element `css` selects.
    pub async fn text_of(&self, css: &str) -> String {
        self.find(css)
            .await
            .text()
            .await
            .expect("an element's text")
    }

    /// Clears the field `css` selects and types `value` into it.
    pub async fn fill(&self, css: &str, value: &str) {
        let field = self.find(css).await;
        field.clear().await.unwrap_or_else(|e| panic!("{css}: {e}"));
        field
            .send_keys(value)
            .await
            .unwrap_or_else(|e| panic!("typing into {css}: {e}"));
    }

    /// Clicks the element `css` selects (a link, a button: its navigation is not waited for).
    pub async fn click(&self, css: &str) {
        self.find(css)
            .await
            .click()
            .await
            .unwrap_or_else(|e| panic!("clicking {css}: {e}"));
    }

    /// Presses one key where the focus is, as the keyboard does: `Key::Tab`, `Key::Enter`.
    pub async fn press(&self, key: Key) {
        self.type_keys(&key).await;
    }

    /// Types `text` where the focus is, key by key (each char down then up; `Key`s included:
    /// `&(Key::Tab + "x")`).
    pub async fn type_keys(&self, text: &str) {
        let mut keys = KeyActions::new("keyboard".to_owned());
        for c in text.chars() {
            keys = keys
                .then(KeyAction::Down { value: c })
                .then(KeyAction::Up { value: c });
        }
        self.client
            .perform_actions(keys)
            .await
            .unwrap_or_else(|e| panic!("typing {text:?}: {e}"));
    }

    /// Presses Tab until the focused element matches `css`, at most `most` times: how many it
    /// took. Panics when the focus never gets there (unreachable by keyboard, or too far).
    pub async fn tab_to(&self, css: &str, most: usize) -> usize {
        for tabs in 1..=most {
            self.press(Key::Tab).await;
            if self.focus_matches(css).await {
                return tabs;
            }
        }
        panic!(
            "{most} Tabs did not reach {css} on {}; the focus is on {}",
            self.url().await,
            self.focused().await.html(false).await.unwrap_or_default()
        );
    }

    /// Whether the focused element matches `css`.
    pub async fn focus_matches(&self, css: &str) -> bool {
        self.client
            .execute(
                "return !!document.activeElement && document.activeElement.matches(arguments[0])",
                vec![json!(css)],
            )
            .await
            .unwrap_or_else(|e| panic!("matching the focus against {css}: {e}"))
            == json!(true)
    }

    /// The element that has the focus (the body when none).
    pub async fn focused(&self) -> Element {
        self.client
            .active_element()
            .await
            .expect("the active element")
    }

    /// Waits until the URL's path is `path`.
    pub async fn wait_for_path(&self, path: &str) {
        let started = Instant::now();
        loop {
            let now = self.path().await;
            if now == path {
                return;
            }
            if started.elapsed() > PATIENCE {
                panic!(
                    "still on {now}, not {path}, after {PATIENCE:?}:\n{}",
                    self.text().await
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the page's text holds `needle`, and returns the text.
    pub async fn wait_for_text(&self, needle: &str) -> String {
        let started = Instant::now();
        loop {
            let text = self.text().await;
            if text.contains(needle) {
                return text;
            }
            if started.elapsed() > PATIENCE {
                panic!(
                    "{needle:?} not on {} after {PATIENCE:?}:\n{text}",
                    self.url().await
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits up to `patience` until the text of the element `css` selects holds `needle`, and
    /// returns that text (for what arrives later than [`PATIENCE`]: an attempt recorded by
    /// history, a replay that ends).
    pub async fn wait_for_text_in(&self, css: &str, needle: &str, patience: Duration) -> String {
        let started = Instant::now();
        loop {
            let text = match self.client.find(Locator::Css(css)).await {
                Ok(element) => element.text().await.unwrap_or_default(),
                Err(_) => String::new(),
            };
            if text.contains(needle) {
                return text;
            }
            if started.elapsed() > patience {
                panic!(
                    "{needle:?} not in {css} on {} after {patience:?}:\n{}",
                    self.url().await,
                    self.text().await
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Opens `url` and presses Tab at most `most` times from the top of the page: the
    /// interactive elements (links, buttons, fields) the focus never reached, each as its HTML.
    /// A page the keyboard serves whole answers none. Elements are told apart by what they are
    /// (tag, target, form, name, text), so a region the page refreshes in place counts as the
    /// same elements.
    pub async fn unreached_by_tab(&self, url: &str, most: usize) -> Vec<String> {
        const KEY: &str = "const key = (el) => [el.tagName, el.getAttribute('href') || '', \
            el.form ? (el.form.getAttribute('action') || '') : '', el.getAttribute('name') || '', \
            el.getAttribute('value') || '', el.id || '', el.textContent.trim()].join('|');";
        self.open(url).await;
        let all = self
            .client
            .execute(
                &format!(
                    "{KEY} const seen = {{}}; \
                     document.querySelectorAll('a[href], button, input, select, textarea, summary, [tabindex]') \
                     .forEach((el) => {{ const native = el.matches('a[href], button, input, select, textarea, summary'); \
                     if ((native || el.tabIndex >= 0) && !el.disabled && el.type !== 'hidden' \
                     && el.getClientRects().length > 0) {{ seen[key(el)] = el.outerHTML; }} }}); \
                     return seen;"
                ),
                vec![],
            )
            .await
            .unwrap_or_else(|e| panic!("listing what {url} offers: {e}"));
        let serde_json::Value::Object(mut missing) = all else {
            panic!("not a list of elements: {all}");
        };
        for _ in 0..most {
            if missing.is_empty() {
                break;
            }
            self.press(Key::Tab).await;
            let focused = self
                .client
                .execute(
                    &format!("{KEY} const el = document.activeElement; return el ? key(el) : '';"),
                    vec![],
                )
                .await
                .unwrap_or_else(|e| panic!("reading the focus on {url}: {e}"));
            if let Some(key) = focused.as_str() {
                missing.remove(key);
            }
        }
        missing
            .into_iter()
            .map(|(_, html)| html.as_str().unwrap_or_default().to_owned())
            .collect()
    }

    /// The text of the JS dialog (alert, confirm, prompt) open now, if one is.
    pub async fn alert(&self) -> Option<String> {
        match self.client.get_alert_text().await {
            Ok(text) => Some(text),
            Err(e) if e.is_no_such_alert() => None,
            Err(e) => panic!("asking for a dialog: {e}"),
        }
    }

    /// A PNG of the window to `path` (its directory created).
    pub async fn screenshot(&self, path: &Path) {
        let png = self.client.screenshot().await.expect("a screenshot");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).expect("the screenshot's directory");
        }
        std::fs::write(path, png).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }

    /// Ends the session (Chromium quits) and the driver.
    pub async fn close(self) {
        let Self {
            client,
            mut driver,
            dir,
        } = self;
        if tokio::time::timeout(Duration::from_secs(5), client.close())
            .await
            .is_ok_and(|closed| closed.is_ok())
        {
            driver.session = None;
        }
        drop(driver);
        drop(dir);
    }
}

/// Starts `chromedriver --port=0` in a process group of its own, with `tmp` as its (and its
/// browser's) `TMPDIR`: the driver and its port.
fn spawn_driver(tmp: &Path) -> (Driver, u16) {
    use std::os::unix::process::CommandExt;
    let mut child = Command::new(CHROMEDRIVER)
        .arg("--port=0")
        .env("TMPDIR", tmp)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("{CHROMEDRIVER}: {e}"));
    let stdout = child.stdout.take().expect("the driver's stdout");
    let mut driver = Driver {
        child,
        port: 0,
        session: None,
    };
    // A thread reads the driver's output for as long as it runs (a full pipe would stop it),
    // passing on the port from "ChromeDriver was started successfully on port N."
    let (port_tx, port_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut port_tx = Some(port_tx);
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(rest) = line.split("successfully on port ").nth(1) {
                let port = rest.trim_end_matches('.').trim().parse::<u16>();
                if let (Some(tx), Ok(port)) = (port_tx.take(), port) {
                    let _ = tx.send(port);
                }
            }
        }
    });
    let port = port_rx
        .recv_timeout(PATIENCE)
        .unwrap_or_else(|_| panic!("{CHROMEDRIVER} did not say its port within {PATIENCE:?}"));
    driver.port = port;
    (driver, port)
}

/// `DELETE /session/{id}` to the driver on `port`, waiting at most a few seconds for its answer.
fn end_session(port: u16, session: &str) {
    use std::io::{Read, Write};
    let deadline = Duration::from_secs(5);
    let Ok(mut stream) = std::net::TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        deadline,
    ) else {
        return;
    };
    let _ = stream.set_read_timeout(Some(deadline));
    let _ = stream.set_write_timeout(Some(deadline));
    let request = format!(
        "DELETE /session/{session} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
         Content-Length: 0\r\nConnection: close\r\n\r\n"
    );
    if stream.write_all(request.as_bytes()).is_ok() {
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
    }
}

/// Waits until the driver's `/status` says it is ready.
async fn wait_until_ready(url: &str) {
    let http = reqwest::Client::new();
    let started = Instant::now();
    loop {
        let ready = async {
            let status: serde_json::Value = http
                .get(format!("{url}/status"))
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            status["value"]["ready"].as_bool()
        };
        if ready.await == Some(true) {
            return;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "chromedriver at {url} not ready within {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}
