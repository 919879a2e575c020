//! Unit tests of `stream.rs`, beside it rather than in it so that the file holds its code alone.

use super::*;
use std::future::poll_fn;

fn next(receiver: &mut ChunkReceiver) -> Poll<Option<Result<Bytes, std::io::Error>>> {
    let waker = Waker::noop();
    let mut cx = Context::from_waker(waker);
    futures_core::Stream::poll_next(Pin::new(receiver), &mut cx)
}

#[test]
fn chunks_arrive_in_order_and_a_finished_body_ends_cleanly() {
    let (sender, mut receiver) = channel(2);
    sender.send(Bytes::from_static(b"a"), || false).unwrap();
    sender.send(Bytes::from_static(b"b"), || false).unwrap();
    sender.finish(Bytes::from_static(b"c"));
    let mut got = Vec::new();
    while let Poll::Ready(Some(chunk)) = next(&mut receiver) {
        got.extend_from_slice(&chunk.unwrap());
    }
    assert_eq!(got, b"abc");
    assert!(matches!(next(&mut receiver), Poll::Ready(None)));
}

#[test]
fn a_sender_dropped_unfinished_cuts_the_body() {
    let (sender, mut receiver) = channel(2);
    sender.send(Bytes::from_static(b"a"), || false).unwrap();
    drop(sender);
    assert!(matches!(next(&mut receiver), Poll::Ready(Some(Ok(_)))));
    assert!(matches!(next(&mut receiver), Poll::Ready(Some(Err(_)))));
    assert!(matches!(next(&mut receiver), Poll::Ready(None)));
}

#[test]
fn a_full_queue_blocks_until_stopped_or_the_receiver_goes() {
    let (sender, receiver) = channel(1);
    sender.send(Bytes::from_static(b"a"), || false).unwrap();
    assert_eq!(
        sender.send(Bytes::from_static(b"b"), || true),
        Err(SendError::Stopped)
    );
    let blocked = std::thread::spawn(move || sender.send(Bytes::from_static(b"b"), || false));
    std::thread::sleep(Duration::from_millis(30));
    drop(receiver);
    assert_eq!(blocked.join().unwrap(), Err(SendError::Gone));
}

#[tokio::test]
async fn an_async_sender_waits_for_room_and_stops_when_the_receiver_goes() {
    let (sender, mut receiver) = channel(1);
    sender
        .send_async(Bytes::from_static(b"a"), || false)
        .await
        .unwrap();
    let producer = tokio::spawn(async move {
        sender
            .send_async(Bytes::from_static(b"b"), || false)
            .await?;
        sender.send_async(Bytes::from_static(b"c"), || false).await
    });
    let first = poll_fn(|cx| futures_core::Stream::poll_next(Pin::new(&mut receiver), cx))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&first[..], b"a");
    tokio::time::sleep(Duration::from_millis(20)).await;
    drop(receiver);
    assert_eq!(producer.await.unwrap(), Err(SendError::Gone));
    let (sender, _receiver) = channel(1);
    sender
        .send_async(Bytes::from_static(b"a"), || false)
        .await
        .unwrap();
    assert_eq!(
        sender.send_async(Bytes::from_static(b"b"), || true).await,
        Err(SendError::Stopped)
    );
}

#[test]
fn a_large_chunk_is_handed_over_in_pieces_and_its_send_waits_for_them() {
    let (sender, mut receiver) = channel(QUEUE_CHUNKS);
    let large: Vec<u8> = (0..1_000_000_u32).map(|i| (i % 251) as u8).collect();
    let expected = large.clone();
    let sent = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let producer = {
        let sent = Arc::clone(&sent);
        std::thread::spawn(move || {
            let result = sender.send(Bytes::from(large), || false);
            sent.store(true, std::sync::atomic::Ordering::SeqCst);
            sender.finish(Bytes::from_static(b"end"));
            result
        })
    };
    std::thread::sleep(Duration::from_millis(50));
    let mut got = Vec::new();
    loop {
        match next(&mut receiver) {
            Poll::Ready(Some(chunk)) => {
                let chunk = chunk.unwrap();
                assert!(chunk.len() <= SPLIT_ABOVE, "a piece of {}", chunk.len());
                got.extend_from_slice(&chunk);
                let left = expected.len().saturating_sub(got.len());
                if left > QUEUE_BYTES {
                    std::thread::sleep(Duration::from_millis(1));
                    assert!(
                        !sent.load(std::sync::atomic::Ordering::SeqCst),
                        "the send returned with {left} bytes not taken"
                    );
                }
            }
            Poll::Ready(None) => break,
            Poll::Pending => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    assert_eq!(producer.join().unwrap(), Ok(()));
    assert_eq!(&got[..expected.len()], &expected[..]);
    assert_eq!(&got[expected.len()..], b"end");
    // Told to stop while its chunk waits: what the client has not taken is dropped, and the
    // body is cut (it would end inside a row).
    let (sender, mut receiver) = channel(QUEUE_CHUNKS);
    assert_eq!(
        sender.send(Bytes::from(vec![0_u8; 1_000_000]), || true),
        Err(SendError::Stopped)
    );
    sender.finish(Bytes::from_static(b"end"));
    assert!(matches!(next(&mut receiver), Poll::Ready(Some(Err(_)))));
    assert!(matches!(next(&mut receiver), Poll::Ready(None)));
}

#[tokio::test]
async fn start_tells_a_stream_from_a_whole_outcome() {
    let (sender, mut receiver) = channel(1);
    drop(sender);
    assert_eq!(receiver.start().await, Start::Nothing);
    let (sender, mut receiver) = channel(1);
    let producer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        sender.send(Bytes::from_static(b"x"), || false).unwrap();
        sender.finish(Bytes::new());
    });
    assert_eq!(receiver.start().await, Start::Streaming);
    let first = poll_fn(|cx| futures_core::Stream::poll_next(Pin::new(&mut receiver), cx))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&first[..], b"x");
    producer.join().unwrap();
}
