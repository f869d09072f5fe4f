//! The coordinator's state is its owner's alone: the embedded store holds the
//! key every rank secret derives from, and a world-readable store let any
//! local user forge results (issue 35). The data folder ends 0700 and the
//! store file 0600 whatever the umask, a folder made looser by hand included.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use common::start;

fn mode(p: &std::path::Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[tokio::test]
async fn the_data_folder_and_store_are_owner_only() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("state");
    std::fs::create_dir(&data).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    let coord = start(&data, Duration::from_secs(15)).await;
    // The store is opened as the coordinator starts; its first call is served after.
    let mut jobs = coord.jobs().await;
    common::list_nodes(&mut jobs).await;
    assert_eq!(mode(&data), 0o700, "the data folder");
    let store = data.join(gpuctl_coordinator::server::STORE_FILE);
    assert_eq!(mode(&store), 0o600, "the store file");
    coord.shutdown().await;
}
