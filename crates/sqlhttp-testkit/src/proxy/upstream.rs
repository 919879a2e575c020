//! The servers behind the proxy: which one a request goes to (round robin), failing over past
//! those that refuse the connection, and how many requests each one was sent.
//!
//! This module knows upstream addresses, connection attempts and per-upstream counters. It must
//! not know about faults, client connections or HTTP.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::net::TcpStream;

/// The upstreams of one proxy, in the order they were given, with their counters.
#[derive(Debug)]
pub(super) struct Upstreams {
    addrs: Vec<SocketAddr>,
    /// The turn counter of the round robin: request `n` starts at upstream `n % len`.
    next: AtomicUsize,
    /// Requests written in full to each upstream, by index.
    forwarded: Vec<AtomicUsize>,
    /// Connection attempts each upstream failed, by index.
    failed_connects: Vec<AtomicUsize>,
}

impl Upstreams {
    /// # Errors
    /// `InvalidInput` when `addrs` is empty.
    pub(super) fn new(addrs: Vec<SocketAddr>) -> io::Result<Upstreams> {
        if addrs.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a chaos proxy needs at least one upstream",
            ));
        }
        let counters = || addrs.iter().map(|_| AtomicUsize::new(0)).collect();
        Ok(Upstreams {
            forwarded: counters(),
            failed_connects: counters(),
            next: AtomicUsize::new(0),
            addrs,
        })
    }

    pub(super) fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// Connects to the upstream whose turn it is; when that connection attempt fails, to the
    /// next one in order, and so on once around. Only a failed connection attempt moves on: the
    /// upstream has seen nothing of the request, so sending it elsewhere cannot make it run
    /// twice. Returns the index of the upstream connected to, or the last attempt's error when
    /// every upstream failed.
    pub(super) async fn connect(&self) -> io::Result<(usize, TcpStream)> {
        let first = self.next.fetch_add(1, Ordering::SeqCst) % self.addrs.len();
        let mut last_error = None;
        for offset in 0..self.addrs.len() {
            let index = (first + offset) % self.addrs.len();
            match TcpStream::connect(self.addrs[index]).await {
                Ok(stream) => return Ok((index, stream)),
                Err(error) => {
                    tracing::debug!(upstream = %self.addrs[index], %error, "chaos proxy: connect failed");
                    self.failed_connects[index].fetch_add(1, Ordering::SeqCst);
                    last_error = Some(error);
                }
            }
        }
        Err(last_error.unwrap_or_else(|| io::Error::other("no upstream")))
    }

    pub(super) fn count_forwarded(&self, index: usize) {
        self.forwarded[index].fetch_add(1, Ordering::SeqCst);
    }

    /// Requests written in full to `addr`; 0 when it is not one of the upstreams.
    pub(super) fn forwarded_to(&self, addr: SocketAddr) -> usize {
        self.sum(&self.forwarded, addr)
    }

    /// Failed connection attempts to `addr`; 0 when it is not one of the upstreams.
    pub(super) fn failed_connects_to(&self, addr: SocketAddr) -> usize {
        self.sum(&self.failed_connects, addr)
    }

    /// The counter of every index holding `addr`, added up (an address given twice gets two
    /// turns of the round robin, and its counts are its total).
    fn sum(&self, counters: &[AtomicUsize], addr: SocketAddr) -> usize {
        self.addrs
            .iter()
            .zip(counters)
            .filter(|(candidate, _)| **candidate == addr)
            .map(|(_, counter)| counter.load(Ordering::SeqCst))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_upstream_is_refused() {
        let error = Upstreams::new(Vec::new()).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn counts_of_an_address_given_twice_add_up() {
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:2".parse().unwrap();
        let upstreams = Upstreams::new(vec![a, b, a]).unwrap();
        upstreams.count_forwarded(0);
        upstreams.count_forwarded(1);
        upstreams.count_forwarded(2);
        assert_eq!(upstreams.forwarded_to(a), 2);
        assert_eq!(upstreams.forwarded_to(b), 1);
        assert_eq!(upstreams.forwarded_to("127.0.0.1:3".parse().unwrap()), 0);
    }
}
