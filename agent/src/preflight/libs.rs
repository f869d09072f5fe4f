//! The libraries the workers will load: libtorch (its version and whether it
//! can drive CUDA) and NCCL (loaded here with `dlopen`, the same file the
//! workers' `LD_LIBRARY_PATH` leads to, to ask `ncclGetVersion`).

use std::ffi::CString;
use std::path::{Path, PathBuf};

use crate::libtorch::Libtorch;

/// What preflight knows about the libtorch the workers will load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TorchInfo {
    /// Where it was found (`Libtorch::describe`).
    pub location: String,
    /// `2.11.0+cu130`; `None` when no version file was found.
    pub version: Option<String>,
    /// The CUDA it was built for (`13.0`); `None` for CPU builds or unknown.
    pub cuda: Option<String>,
    /// `libtorch_cuda.so` is there (GPU workers `dlopen` it).
    pub has_cuda_lib: bool,
}

pub fn torch_info(lt: &Libtorch) -> TorchInfo {
    let (mut version, mut cuda) = (None, None);
    if let Some(sp) = &lt.site_packages {
        if let Ok(text) = std::fs::read_to_string(sp.join("torch/version.py")) {
            (version, cuda) = parse_version_py(&text);
        }
    }
    if version.is_none() {
        // A libtorch zip: `<libtorch>/build-version` holds `2.11.0+cu130`.
        if let Some(dir) = lt.torch_lib.parent() {
            if let Ok(text) = std::fs::read_to_string(dir.join("build-version")) {
                let v = text.trim().to_string();
                if !v.is_empty() {
                    cuda = cuda_of_local_version(&v);
                    version = Some(v);
                }
            }
        }
    }
    TorchInfo {
        location: lt.describe(),
        version,
        cuda,
        has_cuda_lib: lt.torch_lib.join("libtorch_cuda.so").exists(),
    }
}

/// `__version__ = '2.11.0+cu130'` and `cuda: Optional[str] = '13.0'` from
/// `torch/version.py`.
pub fn parse_version_py(text: &str) -> (Option<String>, Option<String>) {
    let value = |line: &str| -> Option<String> {
        let (_, rhs) = line.split_once('=')?;
        let v = rhs.trim().trim_matches(|c| c == '\'' || c == '"');
        (!v.is_empty() && v != "None").then(|| v.to_string())
    };
    let mut version = None;
    let mut cuda = None;
    for line in text.lines() {
        let l = line.trim_start();
        if l.starts_with("__version__") {
            version = value(l);
        } else if l.starts_with("cuda:") || l.starts_with("cuda =") || l.starts_with("cuda=") {
            cuda = value(l);
        }
    }
    if cuda.is_none() {
        cuda = version.as_deref().and_then(cuda_of_local_version);
    }
    (version, cuda)
}

/// `2.11.0+cu130` → `13.0`; `2.11.0+cu128` → `12.8`.
fn cuda_of_local_version(v: &str) -> Option<String> {
    let digits = v.split_once("+cu")?.1;
    if digits.len() < 3 || !digits.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let (major, minor) = digits.split_at(digits.len() - 1);
    Some(format!("{}.{minor}", major.trim_start_matches('0')))
}

/// The NCCL files the workers would load, most likely first: PyTorch's own
/// (`nvidia/nccl/lib/libnccl.so.2`, which the agent's shim links to), then a
/// `libnccl.so.2` in any of libtorch's folders.
pub fn nccl_candidates(lt: &Libtorch) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = lt.nccl().into_iter().collect();
    for d in lt.lib_dirs() {
        let p = d.join("libnccl.so.2");
        if p.exists() && !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

/// `ncclGetVersion`'s integer as people write it: 22809 → `2.28.9`
/// (NCCL ≥ 2.9 uses major×10000 + minor×100 + patch; older, ×1000).
pub fn format_nccl_version(code: i32) -> String {
    if code >= 20900 {
        format!("{}.{}.{}", code / 10000, (code % 10000) / 100, code % 100)
    } else {
        format!("{}.{}.{}", code / 1000, (code % 1000) / 100, code % 100)
    }
}

/// (major, minor) of `2.28.9`.
pub fn major_minor(v: &str) -> Option<(u32, u32)> {
    let mut it = v.split(['.', '+']);
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// Loads the library and asks it its version. The library stays loaded (it
/// is the same file the workers load; unloading NCCL is not worth the risk).
pub fn nccl_version(path: &Path) -> Result<String, String> {
    let c = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| "path holds a NUL byte".to_string())?;
    // SAFETY: a valid NUL-terminated path; RTLD_LOCAL keeps its symbols out
    // of the agent's namespace.
    let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return Err(format!("cannot load it: {}", dlerror()));
    }
    // SAFETY: the handle is valid and the name NUL-terminated.
    let sym = unsafe { libc::dlsym(handle, c"ncclGetVersion".as_ptr()) };
    if sym.is_null() {
        return Err("it has no ncclGetVersion: not an NCCL library".into());
    }
    // SAFETY: ncclGetVersion is `ncclResult_t ncclGetVersion(int *version)`.
    let f: extern "C" fn(*mut libc::c_int) -> libc::c_int = unsafe { std::mem::transmute(sym) };
    let mut code: libc::c_int = 0;
    let rc = f(&mut code);
    if rc != 0 {
        return Err(format!("ncclGetVersion failed (ncclResult {rc})"));
    }
    Ok(format_nccl_version(code))
}

fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a C string valid until the next dl call.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        return "unknown error".into();
    }
    // SAFETY: non-null, NUL-terminated (see above).
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_py_and_local_versions() {
        let text = "from typing import Optional\n__all__ = ['__version__']\n__version__ = '2.11.0+cu130'\ndebug = False\ncuda: Optional[str] = '13.0'\nhip: Optional[str] = None\n";
        assert_eq!(
            parse_version_py(text),
            (Some("2.11.0+cu130".into()), Some("13.0".into()))
        );
        let cpu = "__version__ = '2.11.0+cpu'\ncuda: Optional[str] = None\n";
        assert_eq!(parse_version_py(cpu), (Some("2.11.0+cpu".into()), None));
        assert_eq!(
            cuda_of_local_version("2.8.0+cu128").as_deref(),
            Some("12.8")
        );
        assert_eq!(cuda_of_local_version("2.8.0"), None);
    }

    #[test]
    fn nccl_version_numbers() {
        assert_eq!(format_nccl_version(22809), "2.28.9");
        assert_eq!(format_nccl_version(21805), "2.18.5");
        assert_eq!(format_nccl_version(2804), "2.8.4");
        assert_eq!(major_minor("2.28.9"), Some((2, 28)));
        assert_eq!(major_minor("x"), None);
    }

    #[test]
    fn a_file_that_is_not_a_library_is_an_error_not_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("libnccl.so.2");
        std::fs::write(&p, b"not an ELF file").unwrap();
        let e = nccl_version(&p).unwrap_err();
        assert!(e.starts_with("cannot load it"), "{e}");
        // A real library without the symbol (libc is always there).
        let e = nccl_version(Path::new("libc.so.6")).unwrap_err();
        assert!(e.contains("no ncclGetVersion"), "{e}");
    }

    #[test]
    fn torch_info_from_a_wheel_and_a_zip() {
        let dir = tempfile::tempdir().unwrap();
        let sp = dir.path().join("sp");
        std::fs::create_dir_all(sp.join("torch/lib")).unwrap();
        std::fs::write(
            sp.join("torch/version.py"),
            "__version__ = '2.11.0+cu130'\n",
        )
        .unwrap();
        std::fs::write(sp.join("torch/lib/libtorch_cuda.so"), b"").unwrap();
        let lt = Libtorch {
            torch_lib: sp.join("torch/lib"),
            site_packages: Some(sp.clone()),
        };
        let t = torch_info(&lt);
        assert_eq!(t.version.as_deref(), Some("2.11.0+cu130"));
        assert_eq!(t.cuda.as_deref(), Some("13.0"));
        assert!(t.has_cuda_lib);

        let zip = dir.path().join("libtorch");
        std::fs::create_dir_all(zip.join("lib")).unwrap();
        std::fs::write(zip.join("build-version"), "2.11.0+cpu\n").unwrap();
        let t = torch_info(&Libtorch {
            torch_lib: zip.join("lib"),
            site_packages: None,
        });
        assert_eq!(
            (t.version.as_deref(), t.cuda.as_deref()),
            (Some("2.11.0+cpu"), None)
        );
        assert!(!t.has_cuda_lib);
    }
}
