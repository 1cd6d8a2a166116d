//! A TCP proxy the test controls, to cut a service off and bring it back
//! (PostgreSQL outages) without touching the real server.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Forwards 127.0.0.1:`port` to `upstream` until cut.
pub struct TcpProxy {
    /// Port it listens on.
    pub port: u16,
    cut: Arc<AtomicBool>,
    generation: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl TcpProxy {
    /// Starts forwarding to `upstream` (`host:port`).
    pub async fn start(upstream: &str) -> TcpProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let cut = Arc::new(AtomicBool::new(false));
        let (generation, _) = watch::channel(0u64);
        let upstream = upstream.to_owned();
        let task = {
            let cut = cut.clone();
            let generation = generation.clone();
            tokio::spawn(async move {
                loop {
                    let Ok((mut client, _)) = listener.accept().await else {
                        continue;
                    };
                    if cut.load(Ordering::SeqCst) {
                        drop(client);
                        continue;
                    }
                    let upstream = upstream.clone();
                    let mut changed = generation.subscribe();
                    tokio::spawn(async move {
                        let Ok(mut server) = TcpStream::connect(&upstream).await else {
                            return;
                        };
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                            _ = changed.changed() => {}
                        }
                    });
                }
            })
        };
        TcpProxy {
            port,
            cut,
            generation,
            task,
        }
    }

    /// Drops every open connection and refuses new ones.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }

    /// Accepts connections again.
    pub fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
