//! Headless Chromium (Debian's `chromium`, scripts/debian-packages.txt) driven over the DevTools
//! protocol with `chromiumoxide`, for the web view's tests.
//!
//! * `--no-sandbox`: the tests run as root (CI is root) and Chromium refuses to start its
//!   sandbox as root; the page is our own, served on 127.0.0.1, so nothing untrusted runs in it.
//! * A temporary profile directory per browser, removed afterwards.
//! * Always killed: [`Chromium::close`] closes it and waits; if a test fails first, `Drop` kills
//!   every process of ours that names the profile directory on its command line (the browser
//!   and its helpers), by pid.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use chromiumoxide::browser::{Browser, BrowserConfig};
use chromiumoxide::handler::viewport::Viewport;
use chromiumoxide::page::{Page, ScreenshotParams};
use futures::StreamExt;

/// Debian's browser.
pub const CHROMIUM: &str = "/usr/bin/chromium";

/// A running headless Chromium.
pub struct Chromium {
    pub browser: Browser,
    handler: tokio::task::JoinHandle<()>,
    profile: tempfile::TempDir,
}

impl Chromium {
    /// Starts the browser (fails the test, naming the package, when it is not installed).
    pub async fn launch() -> Chromium {
        assert!(
            std::path::Path::new(CHROMIUM).exists(),
            "{CHROMIUM} is missing: install the Debian package chromium (scripts/debian-packages.txt)"
        );
        let profile = tempfile::Builder::new()
            .prefix("felixrs-web-view-chromium-")
            .tempdir()
            .expect("chromium profile dir");
        let config = BrowserConfig::builder()
            .chrome_executable(CHROMIUM)
            .no_sandbox()
            .user_data_dir(profile.path())
            .window_size(1400, 1000)
            .viewport(Viewport {
                width: 1400,
                height: 1000,
                ..Viewport::default()
            })
            .arg("--disable-gpu")
            .arg("--disable-dev-shm-usage")
            .launch_timeout(Duration::from_secs(60))
            .request_timeout(Duration::from_secs(60))
            .build()
            .expect("browser config");
        let (browser, mut handler) = match Browser::launch(config).await {
            Ok(b) => b,
            Err(e) => {
                kill_profile_processes(profile.path());
                panic!("launching {CHROMIUM}: {e}");
            }
        };
        let handler = tokio::spawn(async move {
            // A message the crate does not know is an error of that message, not of the browser.
            while handler.next().await.is_some() {}
        });
        Chromium {
            browser,
            handler,
            profile,
        }
    }

    /// A new tab at `url`, loaded.
    pub async fn open(&self, url: &str) -> Page {
        let page = self.browser.new_page(url).await.expect("new page");
        page.wait_for_navigation().await.expect("page load");
        page
    }

    /// Closes the browser and waits for it to exit (killed if it does not within 10 s).
    pub async fn close(mut self) {
        let closed = tokio::time::timeout(Duration::from_secs(10), async {
            let _ = self.browser.close().await;
            let _ = self.browser.wait().await;
        })
        .await;
        if closed.is_err() {
            let _ = self.browser.kill().await;
        }
        self.handler.abort();
    }
}

impl Drop for Chromium {
    fn drop(&mut self) {
        kill_profile_processes(self.profile.path());
    }
}

/// SIGKILLs every process whose command line names `profile` (this test's browser and its
/// helper processes; no other process names our temporary directory).
fn kill_profile_processes(profile: &Path) {
    let needle = profile.to_string_lossy().into_owned();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() as i32 {
            continue;
        }
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if String::from_utf8_lossy(&cmdline).contains(&needle) {
            let _ = std::process::Command::new("kill")
                .args(["-9", &pid.to_string()])
                .status();
        }
    }
}

/// Evaluates `js` in the page and returns its JSON value.
pub async fn eval(page: &Page, js: &str) -> serde_json::Value {
    page.evaluate(js)
        .await
        .unwrap_or_else(|e| panic!("evaluating {js}: {e}"))
        .into_value()
        .unwrap_or(serde_json::Value::Null)
}

/// Polls `js` until it is `true`, or fails after `within` with the last value of `show`.
pub async fn wait_for(page: &Page, js: &str, within: Duration, show: &str) -> Duration {
    let started = Instant::now();
    loop {
        if eval(page, js).await == serde_json::Value::Bool(true) {
            return started.elapsed();
        }
        if started.elapsed() > within {
            panic!(
                "not true within {within:?}: {js}\npage shows: {}",
                eval(page, show).await
            );
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Where screenshots go: `target/test-artifacts/web-view/`.
pub fn artifacts_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let dir = target.join("test-artifacts").join("web-view");
    std::fs::create_dir_all(&dir).expect("artifacts dir");
    dir
}

/// Saves a full-page PNG of `page` as `<name>.png` in [`artifacts_dir`]; returns its path.
pub async fn screenshot(page: &Page, name: &str) -> PathBuf {
    let path = artifacts_dir().join(format!("{name}.png"));
    let png = page
        .screenshot(ScreenshotParams::builder().full_page(true).build())
        .await
        .expect("screenshot");
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    std::fs::write(&path, png).expect("write screenshot");
    path
}
