//! The `subscriptions` setting: a file's path, or a PostgreSQL URL.

use std::path::{Path, PathBuf};

/// The `subscriptions` setting, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    File(PathBuf),
    /// A PostgreSQL URL; it may hold a password, so it is shown through
    /// [`super::shown_url`].
    Postgres(String),
}

impl Source {
    pub fn from_setting(setting: &Path) -> Self {
        let text = setting.to_string_lossy();
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            Source::Postgres(text.into_owned())
        } else {
            Source::File(setting.to_path_buf())
        }
    }

    /// For logs: the path, or the URL without its password.
    pub fn shown(&self) -> String {
        match self {
            Source::File(p) => p.display().to_string(),
            Source::Postgres(url) => url::Url::parse(url)
                .map(|u| super::shown_url(&u))
                .unwrap_or_else(|_| "postgres://(unparsable URL)".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_setting_is_a_path_or_a_postgres_url() {
        assert_eq!(
            Source::from_setting(Path::new("subs.toml")),
            Source::File(PathBuf::from("subs.toml"))
        );
        let pg = Source::from_setting(Path::new("postgres://u:pw@db:5432/hookrelay"));
        assert!(matches!(pg, Source::Postgres(_)));
        assert!(!pg.shown().contains("pw"), "{}", pg.shown());
    }
}
