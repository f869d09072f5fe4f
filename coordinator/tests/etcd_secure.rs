//! The etcd store against a real etcd served over TLS with client
//! certificates and then with etcd's authentication on: the coordinator's
//! state (and, without `--rank-key-file`, the key rank secrets derive from)
//! is reached only by who holds a certificate of etcd's CA and the user's
//! password. Plain HTTP, TLS without a certificate and a client without the
//! user are refused at startup, each saying which flag fixes it; a real
//! `gpuctl-coordinator` with the flags serves.
//!
//! etcd must be installed: this test fails (it does not skip) without it.

mod common;

use std::path::Path;
use std::time::Duration;

use common::etcd::{gpuctl, Coordinator, Etcd, EtcdTls};
use gpuctl_coordinator::store::etcd::EtcdStore;
use gpuctl_coordinator::store::etcd_access::EtcdAccess;
use gpuctl_coordinator::store::Store;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A CA, etcd's server certificate (127.0.0.1, localhost) and a client's.
fn certificates(dir: &Path) -> EtcdTls {
    let write = |name: &str, text: String| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.distinguished_name
        .push(DnType::CommonName, "etcd test CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
    let issuer = Issuer::new(ca, ca_key);
    let leaf = |sans: Vec<String>, usages: Vec<ExtendedKeyUsagePurpose>| {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(sans).unwrap();
        p.distinguished_name.push(DnType::CommonName, "etcd test");
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = usages;
        let cert = p.signed_by(&key, &issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let (server_pem, server_key) = leaf(
        vec!["127.0.0.1".into(), "localhost".into()],
        vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
    );
    let (client_pem, client_key) = leaf(
        vec!["gpuctl-coordinator".into()],
        vec![ExtendedKeyUsagePurpose::ClientAuth],
    );
    EtcdTls {
        ca: write("ca.pem", ca_pem),
        server_cert: write("server.pem", server_pem),
        server_key: write("server.key", server_key),
        client_cert: write("client.pem", client_pem),
        client_key: write("client.key", client_key),
    }
}

fn refused(r: Result<EtcdStore, gpuctl_coordinator::store::StoreError>) -> String {
    match r {
        Ok(_) => panic!("etcd answered a client it should have refused"),
        Err(e) => e.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn etcd_over_tls_with_authentication_answers_only_the_coordinator() {
    let dir = tempfile::tempdir().unwrap();
    let tls = certificates(dir.path());
    let mut etcd = Etcd::start_with(Some(&tls)).await;

    // Plain HTTP to a TLS etcd, and https without saying which CA: refused,
    // naming the flags.
    let plain = etcd.url.replace("https://", "http://");
    let e = refused(EtcdStore::connect(&plain, "/s/").await);
    assert!(e.contains("--etcd-ca"), "{e}");
    let e = refused(
        EtcdStore::connect_with(
            &plain,
            "/s/",
            &EtcdAccess {
                ca: Some(tls.ca.clone()),
                ..Default::default()
            },
        )
        .await,
    );
    assert!(e.contains("https://"), "{e}");
    // TLS without a client certificate: etcd runs --client-cert-auth.
    let e = refused(
        EtcdStore::connect_with(
            &etcd.url,
            "/s/",
            &EtcdAccess {
                ca: Some(tls.ca.clone()),
                ..Default::default()
            },
        )
        .await,
    );
    assert!(e.contains("cannot reach etcd"), "{e}");

    // etcd's authentication on, with a root user.
    let opts = etcd
        .access
        .apply(etcd_client::ConnectOptions::new())
        .unwrap();
    let mut admin = etcd_client::Client::connect([etcd.url.as_str()], Some(opts))
        .await
        .unwrap();
    admin.user_add("root", "root-password", None).await.unwrap();
    let _ = admin.role_add("root").await; // built in on some etcd versions
    admin.user_grant_role("root", "root").await.unwrap();
    admin.auth_enable().await.unwrap();

    // A certificate but no user: refused, naming --etcd-user.
    let e = refused(EtcdStore::connect_with(&etcd.url, "/s/", &etcd.access).await);
    assert!(e.contains("--etcd-user"), "{e}");
    // A wrong password: refused too.
    let pw = dir.path().join("password");
    std::fs::write(&pw, "wrong\n").unwrap();
    let mut access = EtcdAccess {
        user: Some("root".into()),
        password_file: Some(pw.clone()),
        ..etcd.access.clone()
    };
    let e = refused(EtcdStore::connect_with(&etcd.url, "/s/", &access).await);
    assert!(e.contains("etcd"), "{e}");

    // Certificate, user and password: state round-trips.
    std::fs::write(&pw, "root-password\n").unwrap();
    let store = EtcdStore::connect_with(&etcd.url, "/s/", &access)
        .await
        .unwrap();
    store.put("a".into(), b"1".to_vec()).await.unwrap();
    assert_eq!(store.get("a".into()).await.unwrap(), Some(b"1".to_vec()));
    drop(store);

    // A real coordinator process given the same as flags serves.
    access.password_file = Some(pw.clone());
    etcd.coordinator_args.extend([
        "--etcd-user".to_string(),
        "root".to_string(),
        "--etcd-password-file".to_string(),
        pw.display().to_string(),
    ]);
    let mut c = Coordinator::start(&etcd, "/gpuctl-secure/", dir.path(), "c1");
    let url = c.serving(Duration::from_secs(30));
    let out = gpuctl(&url, &["nodes", "-o", "json"]);
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        c.log()
    );
}
