//! Models by name: a Hugging Face repo id (`org/name`, optionally `@revision`) resolved in
//! the local Hugging Face cache, offline, as transformers resolves it with
//! `local_files_only=True`.
//!
//! The cache is `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`,
//! else `~/.cache/huggingface/hub`. A repo lives in `models--{org}--{name}`: `refs/{revision}`
//! holds the commit a branch or tag points at, and `snapshots/{commit}/` the files of that
//! commit (links into `blobs/`). A revision that is a commit names its snapshot directly.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The folder a `--model` argument names: the folder itself when it is one, else the cached
/// snapshot of the repo id it spells. A path that is neither is returned as it is, for the
/// loader to say what is missing there.
pub fn resolve_model(arg: &Path) -> Result<PathBuf> {
    if arg.is_dir() {
        return Ok(arg.to_path_buf());
    }
    let Some((text, (repo, revision))) = arg.to_str().and_then(|t| Some((t, parse_repo_id(t)?))) else {
        return Ok(arg.to_path_buf());
    };
    let cache = hub_cache();
    let Some(cache) = cache else {
        return Err(Error::InvalidArgument(format!(
            "{text} is not a folder, and no Hugging Face cache can be found: set HF_HUB_CACHE or HF_HOME"
        )));
    };
    let folder = cache.join(format!("models--{}", repo.replace('/', "--")));
    let looked = |why: String| {
        Error::InvalidArgument(format!(
            "{text} is not a folder, and not in the Hugging Face cache: {why}. It is looked up offline; \
             download it first (huggingface-cli download {repo}) or give the checkpoint's folder"
        ))
    };
    if !folder.is_dir() {
        return Err(looked(format!("{} does not exist", folder.display())));
    }
    let revision = revision.unwrap_or("main");
    let refs = folder.join("refs").join(revision);
    let commit = match std::fs::read_to_string(&refs) {
        Ok(c) => c.trim().to_owned(),
        Err(_) if folder.join("snapshots").join(revision).is_dir() => revision.to_owned(),
        Err(_) => {
            return Err(looked(format!(
                "revision {revision:?} is neither a ref ({} is missing) nor a snapshot in {}",
                refs.display(),
                folder.join("snapshots").display()
            )));
        }
    };
    let snapshot = folder.join("snapshots").join(&commit);
    if !snapshot.join("config.json").is_file() {
        return Err(looked(format!("{} has no config.json", snapshot.display())));
    }
    Ok(snapshot)
}

/// `org/name` or `org/name@revision`, with the characters the Hub allows.
fn parse_repo_id(s: &str) -> Option<(&str, Option<&str>)> {
    let (repo, revision) = match s.split_once('@') {
        Some((_, "")) => return None,
        Some((r, rev)) => (r, Some(rev)),
        None => (s, None),
    };
    let (org, name) = repo.split_once('/')?;
    let ok = |p: &str| {
        !p.is_empty()
            && !p.starts_with('.')
            && !p.starts_with('-')
            && p.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    (ok(org) && ok(name) && !name.contains("..")).then_some((repo, revision))
}

/// The Hugging Face hub cache folder, from the environment as huggingface_hub reads it.
pub fn hub_cache() -> Option<PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    var("HF_HUB_CACHE")
        .or_else(|| var("HUGGINGFACE_HUB_CACHE"))
        .or_else(|| var("HF_HOME").map(|h| h.join("hub")))
        .or_else(|| var("XDG_CACHE_HOME").map(|x| x.join("huggingface").join("hub")))
        .or_else(|| var("HOME").map(|h| h.join(".cache").join("huggingface").join("hub")))
}

#[cfg(test)]
mod tests {
    use super::parse_repo_id;

    #[test]
    fn repo_ids_parse_as_the_hub_spells_them() {
        assert_eq!(parse_repo_id("zai-org/GLM-4-9B-0414"), Some(("zai-org/GLM-4-9B-0414", None)));
        assert_eq!(parse_repo_id("zai-org/GLM-4.5@main"), Some(("zai-org/GLM-4.5", Some("main"))));
        assert_eq!(parse_repo_id("org/name@refs/pr/1"), Some(("org/name", Some("refs/pr/1"))));
        for bad in ["name", "a/b/c", "/abs/path", "./x/y", "org/..", "org/name@", "org/na me"] {
            assert_eq!(parse_repo_id(bad), None, "{bad}");
        }
    }
}
