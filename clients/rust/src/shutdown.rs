//! A shutdown signal shared by workers and consumers.

use tokio::sync::watch;

/// A cloneable "stop now" signal: [`Shutdown::trigger`] from anywhere (any
/// clone, any thread) makes every `run` holding a clone drain and return.
#[derive(Clone, Debug)]
pub struct Shutdown {
    tx: watch::Sender<bool>,
    rx: watch::Receiver<bool>,
}

impl Default for Shutdown {
    fn default() -> Self {
        Self::new()
    }
}

impl Shutdown {
    /// A signal not yet triggered.
    pub fn new() -> Self {
        let (tx, rx) = watch::channel(false);
        Shutdown { tx, rx }
    }

    /// A signal that also triggers on SIGTERM or SIGINT (Ctrl-C). Needs a
    /// running tokio runtime.
    pub fn on_signals() -> Self {
        let s = Self::new();
        let t = s.clone();
        tokio::spawn(async move {
            #[cfg(unix)]
            {
                use tokio::signal::unix::{signal, SignalKind};
                let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                    _ = t.wait() => {}
                }
            }
            #[cfg(not(unix))]
            {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = t.wait() => {}
                }
            }
            t.trigger();
        });
        s
    }

    /// Triggers the signal (idempotent).
    pub fn trigger(&self) {
        self.tx.send_replace(true);
    }

    /// True once triggered.
    pub fn is_triggered(&self) -> bool {
        *self.rx.borrow()
    }

    /// Resolves once triggered.
    pub async fn wait(&self) {
        let mut rx = self.rx.clone();
        // The sender lives in self, so the channel cannot close under us.
        let _ = rx.wait_for(|v| *v).await;
    }
}
