//! The one shutdown signal of every gpuctl process: a [`Shutdown`] that any
//! task can wait on or trip, and [`on_signals`], which trips it on SIGINT or
//! SIGTERM. It is tokio-util's `CancellationToken` under a name that says
//! what it is for, so `cancelled()`, `cancel()`, `child_token()` and the rest
//! work as documented there.

/// Tripped once, seen by every clone. A child token
/// ([`Shutdown::child_token`]) stops with its parent and can also be tripped
/// alone (the coordinator's for a lost leadership).
pub type Shutdown = tokio_util::sync::CancellationToken;

/// A new [`Shutdown`] that trips on the first SIGINT or SIGTERM (logged).
/// Must be called inside a tokio runtime.
pub fn on_signals() -> std::io::Result<Shutdown> {
    let shutdown = Shutdown::new();
    trip_on_signals(shutdown.clone())?;
    Ok(shutdown)
}

/// Trips `shutdown` on the first SIGINT or SIGTERM. The handlers are
/// installed before this returns, so a signal right after start is not lost.
pub fn trip_on_signals(shutdown: Shutdown) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        tokio::spawn(async move {
            let which = tokio::select! {
                _ = int.recv() => "SIGINT",
                _ = term.recv() => "SIGTERM",
                _ = shutdown.cancelled() => return,
            };
            tracing::info!("{which}: stopping");
            shutdown.cancel();
        });
    }
    #[cfg(not(unix))]
    tokio::spawn(async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => tracing::info!("Ctrl-C: stopping"),
            _ = shutdown.cancelled() => return,
        }
        shutdown.cancel();
    });
    Ok(())
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn sigterm_trips_it_and_children_see_it() {
        let shutdown = on_signals().unwrap();
        let child = shutdown.child_token();
        assert!(!shutdown.is_cancelled());
        // SAFETY: raise() only sends a signal to this process, whose handler
        // tokio installed above.
        unsafe { libc::raise(libc::SIGTERM) };
        tokio::time::timeout(Duration::from_secs(5), child.cancelled())
            .await
            .expect("SIGTERM trips the shutdown");
        assert!(shutdown.is_cancelled());
    }
}
