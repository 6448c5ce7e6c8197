//! Real TCP on 127.0.0.1, threads standing in for ranks, ephemeral ports throughout.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::mpsc;
use std::time::Duration;

use super::{fetch, Server, MAGIC};
use crate::error::CommError;

const LONG: Duration = Duration::from_secs(20);
const SHORT: Duration = Duration::from_millis(300);

fn id() -> Vec<u8> {
    (0..128u32).map(|i| (i * 37 % 251) as u8).collect()
}

fn what(r: crate::Result<Vec<u8>>) -> String {
    match r {
        Err(CommError::Rendezvous { what, .. }) => what,
        other => panic!("expected a rendezvous error, got {other:?}"),
    }
}

/// A port nobody listens on (bound, then released).
fn dead_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// A fake rank 0 that reads the hello, writes `reply` and closes.
fn fake_server(reply: Vec<u8>) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut hello = [0u8; 10];
        let _ = s.read_exact(&mut hello);
        let _ = s.write_all(&reply);
    });
    addr
}

#[test]
fn every_rank_receives_rank_zeros_bytes() {
    let server = Server::bind("127.0.0.1:0").unwrap();
    let addr = server.local_addr().unwrap().to_string();
    let peers: Vec<_> = (1..4)
        .map(|rank| {
            let addr = addr.clone();
            std::thread::spawn(move || fetch(&addr, rank, LONG))
        })
        .collect();
    server.serve(&id(), 4, LONG).unwrap();
    for p in peers {
        assert_eq!(p.join().unwrap().unwrap(), id());
    }
}

#[test]
fn peers_that_start_before_rank_zero_retry_until_it_listens() {
    let port = dead_port();
    let addr = format!("127.0.0.1:{port}");
    let (tx, rx) = mpsc::channel();
    let peer = {
        let addr = addr.clone();
        std::thread::spawn(move || {
            tx.send(()).unwrap();
            fetch(&addr, 1, LONG)
        })
    };
    rx.recv().unwrap(); // the peer is running (and being refused) before the bind below
    let server = Server::bind(&addr).unwrap();
    server.serve(b"late", 2, LONG).unwrap();
    assert_eq!(peer.join().unwrap().unwrap(), b"late");
}

#[test]
fn a_refused_connection_is_an_error_once_the_timeout_passes() {
    let why = what(fetch(&format!("127.0.0.1:{}", dead_port()), 1, SHORT));
    assert!(why.contains("no reply within"), "{why}");
    assert!(why.to_lowercase().contains("refused"), "{why}");
}

#[test]
fn a_server_that_never_answers_is_a_timeout() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let (tx, rx) = mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let (_s, _) = l.accept().unwrap();
        let _ = rx.recv(); // hold the connection open, silent, until the client gave up
    });
    let why = what(fetch(&addr, 1, SHORT));
    assert!(why.contains("timed out"), "{why}");
    tx.send(()).unwrap();
    holder.join().unwrap();
}

#[test]
fn malformed_replies_are_clear_errors() {
    let header = |version: u16, len: u32| {
        let mut h = MAGIC.to_vec();
        h.extend_from_slice(&version.to_le_bytes());
        h.extend_from_slice(&len.to_le_bytes());
        h
    };
    let mut truncated = header(1, 128);
    truncated.extend_from_slice(&[7; 5]);
    let cases = [
        (b"HTTP/1.1 400 Bad Request\r\n".to_vec(), "magic"),
        (header(2, 128), "version 2"),
        (header(1, 1 << 20), "exceeds"),
        (truncated, "closed before"),
    ];
    for (reply, expect) in cases {
        let why = what(fetch(&fake_server(reply), 1, LONG));
        assert!(
            why.contains("malformed") || why.contains("version"),
            "{why}"
        );
        assert!(why.contains(expect), "{expect:?} not in {why:?}");
    }
}

#[test]
fn rank_zero_times_out_naming_the_ranks_that_never_came() {
    let server = Server::bind("127.0.0.1:0").unwrap();
    let addr = server.local_addr().unwrap().to_string();
    let peer = std::thread::spawn(move || fetch(&addr, 2, LONG));
    let err = server.serve(b"x", 3, Duration::from_secs(2)).unwrap_err();
    assert!(
        err.to_string().contains("ranks [1] did not connect"),
        "{err}"
    );
    assert_eq!(peer.join().unwrap().unwrap(), b"x");
}

#[test]
fn stray_and_repeated_clients_are_not_counted_as_ranks() {
    let server = Server::bind("127.0.0.1:0").unwrap();
    let addr = server.local_addr().unwrap().to_string();
    let a = addr.clone();
    let peers = std::thread::spawn(move || {
        let mut stray = std::net::TcpStream::connect(&a).unwrap();
        stray.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
        // Rank 1 twice (a retry after a lost reply): still only rank 1.
        (fetch(&a, 1, LONG), fetch(&a, 1, LONG))
    });
    let err = server.serve(b"id", 3, Duration::from_secs(2)).unwrap_err();
    assert!(
        err.to_string().contains("ranks [2] did not connect"),
        "{err}"
    );
    let (first, second) = peers.join().unwrap();
    assert_eq!(
        (first.unwrap(), second.unwrap()),
        (b"id".to_vec(), b"id".to_vec())
    );
}
