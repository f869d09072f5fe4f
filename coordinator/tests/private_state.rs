//! The coordinator's state is its owner's alone: the embedded store holds the
//! key every rank secret derives from, and a world-readable store let any
//! local user forge results (issue 35). The data folder ends 0700 and the
//! store file 0600 whatever the umask, a folder made looser by hand included;
//! the key itself lives in a file of its own (0600), not in the store, and a
//! key an older coordinator stored is moved there.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use common::start;
use gpuctl_coordinator::server::{RANK_KEY_FILE, STORE_FILE};
use gpuctl_coordinator::store::{RedbStore, Store};

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
    let store = data.join(STORE_FILE);
    assert_eq!(mode(&store), 0o600, "the store file");
    coord.shutdown().await;
    assert_eq!(mode(&data.join(RANK_KEY_FILE)), 0o600, "the key file");
    let raw = RedbStore::open(&store).unwrap();
    assert!(
        raw.get("meta/rank_key".into()).await.unwrap().is_none(),
        "the store holds no key"
    );
}

#[tokio::test]
async fn a_stored_key_moves_to_its_own_file() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("state");
    std::fs::create_dir(&data).unwrap();
    {
        let raw = RedbStore::open(&data.join(STORE_FILE)).unwrap();
        raw.put("meta/rank_key".into(), vec![7u8; 32])
            .await
            .unwrap();
        raw.close().await.unwrap();
    }
    let coord = start(&data, Duration::from_secs(15)).await;
    let mut jobs = coord.jobs().await;
    common::list_nodes(&mut jobs).await;
    coord.shutdown().await;
    let hex = std::fs::read_to_string(data.join(RANK_KEY_FILE)).unwrap();
    assert_eq!(
        hex.trim(),
        "07".repeat(32),
        "the same key: running jobs' secrets hold"
    );
    let raw = RedbStore::open(&data.join(STORE_FILE)).unwrap();
    assert!(raw.get("meta/rank_key".into()).await.unwrap().is_none());
}
