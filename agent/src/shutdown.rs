//! Shutdown signalling: one trigger, any number of waiters.

use tokio::sync::watch;

/// Tells the agent to stop.
#[derive(Debug)]
pub struct ShutdownTrigger(watch::Sender<bool>);

impl ShutdownTrigger {
    pub fn trigger(&self) {
        let _ = self.0.send(true);
    }
}

/// Resolves once shutdown was requested.
#[derive(Debug, Clone)]
pub struct Shutdown(watch::Receiver<bool>);

impl Shutdown {
    pub fn new() -> (ShutdownTrigger, Shutdown) {
        let (tx, rx) = watch::channel(false);
        (ShutdownTrigger(tx), Shutdown(rx))
    }

    /// Waits until shutdown is requested (or the trigger is gone).
    pub async fn requested(&mut self) {
        let _ = self.0.wait_for(|stop| *stop).await;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn shutdown_wakes_waiters_without_real_time() {
        let (trigger, mut shutdown) = Shutdown::new();
        let waiter = tokio::spawn(async move {
            tokio::select! {
                () = shutdown.requested() => "stopped",
                () = tokio::time::sleep(Duration::from_secs(3600)) => "timed out",
            }
        });
        tokio::task::yield_now().await;
        trigger.trigger();
        assert_eq!(waiter.await.unwrap(), "stopped");
        // With the trigger gone, waiting returns at once too.
        let (trigger, mut shutdown) = Shutdown::new();
        drop(trigger);
        shutdown.requested().await;
    }
}
