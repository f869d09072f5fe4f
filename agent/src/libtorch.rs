//! Finding libtorch and building the workers' `LD_LIBRARY_PATH`.
//!
//! The worker links only `libtorch_cpu.so` and `dlopen`s `libtorch_cuda.so` on
//! a GPU host, so it finds both, NCCL and the CUDA runtime through
//! `LD_LIBRARY_PATH`, which the dynamic loader reads only at process start:
//! the agent must set it when it spawns a worker.
//!
//! Two NCCLs in one process break `ncclCommInitRank` (DESIGN.md): the worker's
//! NCCL loader looks for `libnccl.so`, libtorch_cuda loads `libnccl.so.2`. A
//! per-agent shim folder holding `libnccl.so` → PyTorch's `libnccl.so.2`, first
//! on the path, makes both load the same file.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

/// The torch 2.11.0 the install script fetches (tch 0.24 wants exactly it).
pub const TORCH_VERSION: &str = "2.11.0";

/// A libtorch the workers can load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Libtorch {
    /// The folder that holds `libtorch_cpu.so`.
    pub torch_lib: PathBuf,
    /// The Python `site-packages` holding `torch/` and `nvidia/*/lib`, when
    /// libtorch came from a wheel (the usual case); `None` for a plain
    /// libtorch zip.
    pub site_packages: Option<PathBuf>,
}

impl Libtorch {
    /// One line for logs and `HostFacts.libtorch`.
    pub fn describe(&self) -> String {
        match &self.site_packages {
            Some(sp) => sp.display().to_string(),
            None => self.torch_lib.display().to_string(),
        }
    }

    /// PyTorch's NCCL, when this site-packages carries one.
    pub fn nccl(&self) -> Option<PathBuf> {
        let p = self
            .site_packages
            .as_ref()?
            .join("nvidia/nccl/lib/libnccl.so.2");
        p.exists().then_some(p)
    }

    /// Library folders in the order the loader must search them: torch's own,
    /// NCCL, the CUDA 13 runtime, then every other `nvidia/*/lib` (cuBLAS,
    /// cuDNN, ... as separate wheels), each only if it exists.
    pub fn lib_dirs(&self) -> Vec<PathBuf> {
        let mut dirs = vec![self.torch_lib.clone()];
        if let Some(sp) = &self.site_packages {
            let nvidia = sp.join("nvidia");
            dirs.push(nvidia.join("nccl/lib"));
            dirs.push(nvidia.join("cu13/lib"));
            let mut others: Vec<PathBuf> = std::fs::read_dir(&nvidia)
                .map(|rd| rd.flatten().map(|e| e.path().join("lib")).collect())
                .unwrap_or_default();
            others.sort();
            dirs.extend(others);
        }
        let mut out: Vec<PathBuf> = Vec::new();
        for d in dirs {
            if d.is_dir() && !out.contains(&d) {
                out.push(d);
            }
        }
        out
    }
}

/// Where `scripts/install-libtorch.sh` puts libtorch: `$GPUCTL_CACHE` or
/// `~/.cache/gpuctl`, then `libtorch-<version>`.
pub fn default_install_dir() -> Option<PathBuf> {
    let cache = match std::env::var_os("GPUCTL_CACHE") {
        Some(c) if !c.is_empty() => PathBuf::from(c),
        _ => PathBuf::from(std::env::var_os("HOME")?).join(".cache/gpuctl"),
    };
    Some(cache.join(format!("libtorch-{TORCH_VERSION}")))
}

/// Finds libtorch: the folder given (`--libtorch` or `GPUCTL_LIBTORCH`), else
/// the install script's folder. The error says where it looked and the fix.
pub fn find(explicit: Option<&Path>) -> Result<Libtorch, String> {
    if let Some(dir) = explicit {
        return resolve(dir).map_err(|e| format!("--libtorch {}: {e}", dir.display()));
    }
    let Some(dir) = default_install_dir() else {
        return Err("not found: HOME is unset; pass --libtorch DIR".into());
    };
    resolve(&dir).map_err(|e| {
        format!(
            "not found in {} ({e}); run scripts/install-libtorch.sh or pass --libtorch DIR",
            dir.display()
        )
    })
}

/// Accepts any of the layouts an operator is likely to point at:
/// - the install script's folder (`<dir>/site-packages/torch/lib`),
/// - a `site-packages` folder (`<dir>/torch/lib`),
/// - a `torch` package folder (`<sp>/torch`, holding `lib/`),
/// - a tch-style libtorch folder (`<dir>/lib/libtorch_cpu.so`), whose library
///   may be a link into a wheel (the install script's `libtorch/`), in which
///   case that wheel's site-packages is used.
pub fn resolve(dir: &Path) -> Result<Libtorch, String> {
    if !dir.is_dir() {
        return Err("no such folder".into());
    }
    let has_torch =
        |lib: &Path| lib.join("libtorch_cpu.so").exists() || lib.join("libtorch.so").exists();
    let from_sp = |sp: PathBuf| -> Result<Libtorch, String> {
        let torch_lib = sp.join("torch/lib");
        if !has_torch(&torch_lib) {
            return Err(format!("no libtorch_cpu.so in {}", torch_lib.display()));
        }
        Ok(Libtorch {
            torch_lib,
            site_packages: Some(sp),
        })
    };
    if dir.join("site-packages/torch/lib").is_dir() {
        return from_sp(dir.join("site-packages"));
    }
    if dir.join("torch/lib").is_dir() {
        return from_sp(dir.to_path_buf());
    }
    if dir.file_name() == Some(OsStr::new("torch")) && dir.join("lib").is_dir() {
        if let Some(sp) = dir.parent() {
            return from_sp(sp.to_path_buf());
        }
    }
    let lib = dir.join("lib");
    if has_torch(&lib) {
        // Follow a link into a wheel: .../site-packages/torch/lib/libtorch_cpu.so.
        if let Ok(real) = std::fs::canonicalize(lib.join("libtorch_cpu.so")) {
            let torch_lib = real.parent().map(Path::to_path_buf);
            let sp = torch_lib
                .as_deref()
                .and_then(Path::parent)
                .filter(|t| t.file_name() == Some(OsStr::new("torch")))
                .and_then(Path::parent);
            if let (Some(_), Some(sp)) = (&torch_lib, sp) {
                if let Ok(found) = from_sp(sp.to_path_buf()) {
                    return Ok(found);
                }
            }
        }
        return Ok(Libtorch {
            torch_lib: lib,
            site_packages: None,
        });
    }
    Err("no site-packages/torch/lib, torch/lib or lib/libtorch_cpu.so in it".into())
}

/// Makes `<shim_dir>/libnccl.so` a link to `nccl` (replacing an old link
/// atomically, since several agents on one host may share a work dir).
pub fn make_nccl_shim(shim_dir: &Path, nccl: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(shim_dir)?;
    let link = shim_dir.join("libnccl.so");
    if std::fs::read_link(&link).ok().as_deref() == Some(nccl) {
        return Ok(());
    }
    let tmp = shim_dir.join(format!(".libnccl.so.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(nccl, &tmp)?;
    std::fs::rename(&tmp, &link)
}

/// The workers' `LD_LIBRARY_PATH`: the NCCL shim (made in `shim_dir` when
/// libtorch has PyTorch's NCCL), libtorch's folders, then `existing` (the
/// agent's own `LD_LIBRARY_PATH`), without duplicates.
pub fn ld_library_path(
    libtorch: Option<&Libtorch>,
    shim_dir: &Path,
    existing: Option<&OsStr>,
) -> std::io::Result<OsString> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(lt) = libtorch {
        if let Some(nccl) = lt.nccl() {
            make_nccl_shim(shim_dir, &nccl)?;
            dirs.push(shim_dir.to_path_buf());
        }
        dirs.extend(lt.lib_dirs());
    }
    if let Some(existing) = existing {
        for d in std::env::split_paths(existing) {
            if !d.as_os_str().is_empty() && !dirs.contains(&d) {
                dirs.push(d);
            }
        }
    }
    std::env::join_paths(dirs).map_err(std::io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(p: &Path) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, b"").unwrap();
    }

    /// The install script's layout, with a GPU host's extra wheels.
    fn fixture(root: &Path) -> PathBuf {
        let dest = root.join("libtorch-2.11.0");
        let sp = dest.join("site-packages");
        touch(&sp.join("torch/lib/libtorch_cpu.so"));
        touch(&sp.join("nvidia/nccl/lib/libnccl.so.2"));
        touch(&sp.join("nvidia/cu13/lib/libcudart.so.13"));
        touch(&sp.join("nvidia/cudnn/lib/libcudnn.so.9"));
        std::fs::create_dir_all(sp.join("nvidia/nolib")).unwrap();
        std::fs::create_dir_all(dest.join("libtorch/lib")).unwrap();
        std::os::unix::fs::symlink(
            sp.join("torch/lib/libtorch_cpu.so"),
            dest.join("libtorch/lib/libtorch_cpu.so"),
        )
        .unwrap();
        dest
    }

    #[test]
    fn every_layout_resolves_to_the_same_site_packages() {
        let tmp = tempfile::tempdir().unwrap();
        let dest = fixture(tmp.path());
        let sp = dest.join("site-packages");
        let want = Libtorch {
            torch_lib: sp.join("torch/lib"),
            site_packages: Some(sp.clone()),
        };
        assert_eq!(resolve(&dest).unwrap(), want, "install folder");
        assert_eq!(resolve(&sp).unwrap(), want, "site-packages");
        assert_eq!(resolve(&sp.join("torch")).unwrap(), want, "torch folder");
        // Through the link: canonical paths, so compare canonically.
        let via_link = resolve(&dest.join("libtorch")).unwrap();
        assert_eq!(
            via_link.site_packages.unwrap().canonicalize().unwrap(),
            sp.canonicalize().unwrap(),
            "tch LIBTORCH folder"
        );
    }

    #[test]
    fn bad_folders_say_why() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(resolve(&tmp.path().join("absent"))
            .unwrap_err()
            .contains("no such folder"));
        std::fs::create_dir_all(tmp.path().join("sp/torch/lib")).unwrap();
        let e = resolve(&tmp.path().join("sp")).unwrap_err();
        assert!(e.contains("no libtorch_cpu.so"), "{e}");
        let e = find(Some(&tmp.path().join("absent"))).unwrap_err();
        assert!(e.starts_with("--libtorch "), "{e}");
    }

    #[test]
    fn ld_library_path_order_and_nccl_shim() {
        let tmp = tempfile::tempdir().unwrap();
        let dest = fixture(tmp.path());
        let sp = dest.join("site-packages");
        let lt = resolve(&dest).unwrap();
        let shim = tmp.path().join("work/nccl-shim");
        let existing = OsString::from(format!("/opt/x/lib::{}", sp.join("torch/lib").display()));
        let path = ld_library_path(Some(&lt), &shim, Some(&existing)).unwrap();
        let got: Vec<PathBuf> = std::env::split_paths(&path).collect();
        assert_eq!(
            got,
            vec![
                shim.clone(),
                sp.join("torch/lib"),
                sp.join("nvidia/nccl/lib"),
                sp.join("nvidia/cu13/lib"),
                sp.join("nvidia/cudnn/lib"),
                PathBuf::from("/opt/x/lib"),
            ]
        );
        assert_eq!(
            std::fs::read_link(shim.join("libnccl.so")).unwrap(),
            sp.join("nvidia/nccl/lib/libnccl.so.2")
        );
        // Again: the link is kept (and would be replaced if it pointed elsewhere).
        ld_library_path(Some(&lt), &shim, None).unwrap();
        make_nccl_shim(&shim, Path::new("/elsewhere/libnccl.so.2")).unwrap();
        assert_eq!(
            std::fs::read_link(shim.join("libnccl.so")).unwrap(),
            Path::new("/elsewhere/libnccl.so.2")
        );
    }

    #[test]
    fn no_shim_without_pytorch_nccl() {
        let tmp = tempfile::tempdir().unwrap();
        touch(&tmp.path().join("sp/torch/lib/libtorch_cpu.so"));
        let lt = resolve(&tmp.path().join("sp")).unwrap();
        let shim = tmp.path().join("shim");
        let path = ld_library_path(Some(&lt), &shim, None).unwrap();
        assert_eq!(
            std::env::split_paths(&path).collect::<Vec<_>>(),
            vec![tmp.path().join("sp/torch/lib")]
        );
        assert!(!shim.exists());
    }
}
