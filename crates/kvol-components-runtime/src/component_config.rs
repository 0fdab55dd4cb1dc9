//! The runtime copy of a component's config file: rendered from the user's file, checked, and replaced whole before the process is told.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kvol_components::component_config::{Rendered, render};
use kvol_components::definition::{CANDIDATE, ConfigFileSpec};
use kvol_plugin::atomic_file::{self, Durability};

/// How long a definition's config check may run before the candidate is refused.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a component's config comes from and where kvol puts the copy its process reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ComponentConfig {
    pub component: String,
    /// The user's file, watched: `<config dir>/<component>.yaml`.
    pub source: PathBuf,
    /// The copy the process reads (`{config}`): `<state>/components/<component>.yaml`.
    pub copy: PathBuf,
    pub spec: ConfigFileSpec,
    /// The definition's check with every placeholder but `{candidate}` filled.
    pub check: Option<Vec<String>>,
}

/// What a refresh did to the copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refresh {
    /// The copy already held what the user's file asks for.
    Unchanged,
    /// The copy was replaced (or removed): the process must be told.
    Replaced,
}

impl ComponentConfig {
    /// Brings the copy in line with the user's file: rendered over the defaults, checked as a
    /// candidate file beside the copy, then written, fsynced and renamed into place. Any
    /// failure leaves the copy as it was and says why, naming the user's file.
    pub async fn refresh(&self) -> Result<Refresh, String> {
        let user = match std::fs::read_to_string(&self.source) {
            Ok(text) => Some(text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(format!("cannot read {}: {e}", self.source.display())),
        };
        let origin = self.source.display().to_string();
        let rendered = render(&self.component, &self.spec, user.as_deref(), &origin)?;
        let current = std::fs::read_to_string(&self.copy).ok();
        match rendered {
            Rendered::Absent if current.is_none() => Ok(Refresh::Unchanged),
            Rendered::Absent => {
                std::fs::remove_file(&self.copy)
                    .map_err(|e| format!("cannot remove {}: {e}", self.copy.display()))?;
                Ok(Refresh::Replaced)
            }
            Rendered::File(text) if current.as_deref() == Some(text.as_str()) => Ok(Refresh::Unchanged),
            Rendered::File(text) => {
                self.check_candidate(&text).await?;
                atomic_file::replace(&self.copy, text.as_bytes(), Durability::Synced)
                    .map_err(|e| e.to_string())?;
                Ok(Refresh::Replaced)
            }
        }
    }

    /// The candidate's file, beside the copy.
    pub fn candidate_path(&self) -> PathBuf {
        let name = self.copy.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        self.copy.with_file_name(format!(".{name}.candidate"))
    }

    async fn check_candidate(&self, text: &str) -> Result<(), String> {
        let Some(check) = &self.check else { return Ok(()) };
        let candidate = self.candidate_path();
        atomic_file::replace(&candidate, text.as_bytes(), Durability::AtomicOnly)
            .map_err(|e| e.to_string())?;
        let outcome = run_check(check, &candidate).await;
        let _ = std::fs::remove_file(&candidate);
        outcome.map_err(|why| {
            format!("{} refused by component {}'s check: {why}", self.source.display(), self.component)
        })
    }
}

/// Runs `check` with `{candidate}` filled; `Err` carries the exit and what it printed.
async fn run_check(check: &[String], candidate: &Path) -> Result<(), String> {
    let candidate_text = candidate.display().to_string();
    let command: Vec<String> = check.iter().map(|a| a.replace(CANDIDATE, &candidate_text)).collect();
    let (program, args) = command.split_first().ok_or("the check names no program")?;
    let child = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = match tokio::time::timeout(CHECK_TIMEOUT, child).await {
        Err(_) => return Err(format!("{program} did not finish in {} s", CHECK_TIMEOUT.as_secs())),
        Ok(Err(e)) => return Err(format!("cannot run {program}: {e}")),
        Ok(Ok(output)) => output,
    };
    if output.status.success() {
        return Ok(());
    }
    let printed: Vec<String> = [&output.stderr, &output.stdout]
        .iter()
        .flat_map(|bytes| {
            String::from_utf8_lossy(bytes).lines().map(str::trim).map(String::from).collect::<Vec<_>>()
        })
        .filter(|line| !line.is_empty())
        .collect();
    Err(format!("{} ({})", printed.join("; "), output.status))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(dir: &Path, check: Option<Vec<String>>) -> ComponentConfig {
        ComponentConfig {
            component: "c".into(),
            source: dir.join("etc/c.yaml"),
            copy: dir.join("state/components/c.yaml"),
            spec: ConfigFileSpec {
                defaults: Some(serde_json::json!({"level": "info"})),
                check: check.clone(),
            },
            check,
        }
    }

    #[tokio::test]
    async fn edits_reach_the_copy_only_when_they_pass() {
        let dir = tempfile::tempdir().unwrap();
        // The check refuses any candidate that mentions "bad".
        let check = vec![
            "sh".into(),
            "-c".into(),
            "! grep -q bad \"$0\" || { echo found bad >&2; exit 3; }".into(),
            CANDIDATE.into(),
        ];
        let c = config(dir.path(), Some(check));
        std::fs::create_dir_all(c.source.parent().unwrap()).unwrap();
        let copy = || std::fs::read_to_string(&c.copy).ok();

        assert_eq!(c.refresh().await, Ok(Refresh::Replaced), "no user file: the defaults");
        assert!(copy().unwrap().contains("level: info"), "{:?}", copy());
        assert_eq!(c.refresh().await, Ok(Refresh::Unchanged), "nothing new");

        std::fs::write(&c.source, "level: debug\n").unwrap();
        assert_eq!(c.refresh().await, Ok(Refresh::Replaced));
        assert!(copy().unwrap().contains("level: debug"));

        for (what, text, words) in [
            ("refused by the check", "level: bad\n", "refused by component c's check: found bad"),
            ("not yaml", "level: [deb", "invalid yaml"),
            ("empty", "", "is empty"),
        ] {
            std::fs::write(&c.source, text).unwrap();
            let error = c.refresh().await.unwrap_err();
            assert!(
                error.contains(words) && error.contains(&c.source.display().to_string()),
                "{what}: {error}"
            );
            assert!(copy().unwrap().contains("level: debug"), "{what}: the copy stays");
            assert!(!c.candidate_path().exists(), "{what}: no candidate left");
        }

        std::fs::remove_file(&c.source).unwrap();
        assert_eq!(c.refresh().await, Ok(Refresh::Replaced), "removed: back to the defaults");
        assert!(copy().unwrap().contains("level: info"));
    }

    #[tokio::test]
    async fn with_no_defaults_a_removed_file_removes_the_copy() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = config(dir.path(), None);
        c.spec.defaults = None;
        std::fs::create_dir_all(c.source.parent().unwrap()).unwrap();
        assert_eq!(c.refresh().await, Ok(Refresh::Unchanged), "nothing to write");
        std::fs::write(&c.source, "a: 1\n").unwrap();
        assert_eq!(c.refresh().await, Ok(Refresh::Replaced));
        std::fs::remove_file(&c.source).unwrap();
        assert_eq!(c.refresh().await, Ok(Refresh::Replaced));
        assert!(!c.copy.exists(), "the component makes its own default");
    }

    #[tokio::test]
    async fn a_check_that_cannot_run_refuses() {
        let dir = tempfile::tempdir().unwrap();
        let c = config(dir.path(), Some(vec!["/nonexistent/check".into(), CANDIDATE.into()]));
        let error = c.refresh().await.unwrap_err();
        assert!(error.contains("cannot run /nonexistent/check"), "{error}");
        assert!(!c.copy.exists());
    }
}
