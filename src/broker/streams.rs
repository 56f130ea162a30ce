//! Reading the ladder's streams (the archive, the attempt log) from an offset: what replay,
//! trace and history build on. A stream keeps what it holds whoever reads it; a reader names
//! where to start and acknowledges what it read (the broker's credit for the next ones).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::{AMQPValue, FieldTable};

/// How long the end of a stream is looked for: a reader attached at the last chunk gets what
/// it holds at once; this much quiet means there is no more.
const QUIET: Duration = Duration::from_millis(500);
/// How long a reader of a window waits for its next message before it takes the window to be
/// read: longer than [`QUIET`], as a window may be long and the broker busy.
const WINDOW_QUIET: Duration = Duration::from_secs(5);
/// Stream messages in flight to a window's reader.
const PREFETCH: u16 = 500;

/// A stream could not be read.
#[derive(Debug, thiserror::Error)]
#[error("reading {stream}: {source}")]
pub struct StreamReadError {
    pub stream: String,
    pub source: lapin::Error,
}

/// Where a reader starts in a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamStart {
    /// The oldest message the stream still keeps.
    First,
    /// The messages published after the reader attached.
    Next,
    /// The last chunk the stream holds (the messages the broker wrote last, together), then
    /// what follows.
    Last,
    /// This offset (or the first kept after it, when retention dropped it).
    Offset(u64),
    /// The first chunk written at or after this time, in seconds since the epoch. Chunks
    /// group messages written together, so a few earlier messages may come first: filter by
    /// what the message says if exactness matters.
    Timestamp(u64),
}

impl StreamStart {
    fn argument(self) -> AMQPValue {
        match self {
            StreamStart::First => AMQPValue::LongString("first".into()),
            StreamStart::Next => AMQPValue::LongString("next".into()),
            StreamStart::Last => AMQPValue::LongString("last".into()),
            StreamStart::Offset(o) => AMQPValue::LongLongInt(o.min(i64::MAX as u64) as i64),
            StreamStart::Timestamp(s) => AMQPValue::Timestamp(s),
        }
    }
}

/// A reader of one stream on a channel of its own.
pub struct StreamReader {
    channel: lapin::Channel,
    consumer: lapin::Consumer,
}

/// One message read, with its offset in the stream.
pub struct StreamMessage {
    pub offset: Option<u64>,
    pub delivery: Delivery,
}

impl StreamReader {
    /// Attaches to `stream` at `start`; `prefetch` messages may be in flight to the reader.
    pub async fn open(
        conn: &lapin::Connection,
        stream: &str,
        start: StreamStart,
        prefetch: u16,
    ) -> Result<Self, lapin::Error> {
        let channel = conn.create_channel().await?;
        channel
            .basic_qos(prefetch.max(1), BasicQosOptions::default())
            .await?;
        let mut args = FieldTable::default();
        args.insert("x-stream-offset".into(), start.argument());
        let consumer = channel
            .basic_consume(
                stream.into(),
                "".into(),
                BasicConsumeOptions::default(),
                args,
            )
            .await?;
        Ok(Self { channel, consumer })
    }

    /// The next message, acknowledged (a stream keeps it anyway), or `None` when the reader
    /// was cancelled (the stream deleted, the connection lost).
    ///
    /// Cancel-safe, so it can be raced against a timeout: a message is either returned or left
    /// with the consumer. The acknowledgement (for a stream, only credit for the next messages)
    /// is sent by a task of its own rather than awaited here, where a timeout could drop the
    /// message between taking it and returning it.
    pub async fn next(&mut self) -> Option<Result<StreamMessage, lapin::Error>> {
        let delivery = match self.consumer.next().await? {
            Ok(d) => d,
            Err(e) => return Some(Err(e)),
        };
        let offset = offset_of(&delivery);
        let acker = delivery.acker.clone();
        tokio::spawn(async move {
            // A failed ack means the channel is gone; the consumer reports that next.
            let _ = acker.ack(BasicAckOptions::default()).await;
        });
        Some(Ok(StreamMessage { offset, delivery }))
    }

    /// Detaches from the stream.
    pub async fn close(self) {
        let _ = self.channel.close(200, "done".into()).await;
    }
}

/// The offset the broker gives a stream message (`x-stream-offset`).
pub fn offset_of(delivery: &Delivery) -> Option<u64> {
    let headers = delivery.properties.headers().as_ref()?;
    match headers.inner().get("x-stream-offset")? {
        AMQPValue::LongLongInt(n) => u64::try_from(*n).ok(),
        AMQPValue::LongInt(n) => u64::try_from(*n).ok(),
        AMQPValue::LongUInt(n) => Some(u64::from(*n)),
        AMQPValue::Timestamp(n) => Some(*n),
        _ => None,
    }
}

fn seconds(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The first offset not to read in `stream`: the first at or after `to`, else one past the
/// last message the stream holds now. `None` when the stream holds nothing.
pub async fn end_of(
    conn: &lapin::Connection,
    stream: &str,
    to: Option<SystemTime>,
) -> Result<Option<u64>, StreamReadError> {
    let read = |source| StreamReadError {
        stream: stream.to_owned(),
        source,
    };
    if let Some(to) = to {
        let mut reader = StreamReader::open(conn, stream, StreamStart::Timestamp(seconds(to)), 1)
            .await
            .map_err(read)?;
        let first = tokio::time::timeout(QUIET, reader.next()).await;
        reader.close().await;
        if let Ok(Some(Ok(m))) = first
            && let Some(offset) = m.offset
        {
            return Ok(Some(offset));
        }
    }
    // The last chunk: read it to its end.
    let mut reader = StreamReader::open(conn, stream, StreamStart::Last, PREFETCH)
        .await
        .map_err(read)?;
    let mut last = None;
    while let Ok(Some(next)) = tokio::time::timeout(QUIET, reader.next()).await {
        let m = next.map_err(read)?;
        last = last.max(m.offset);
    }
    reader.close().await;
    Ok(last.map(|l| l + 1))
}

/// Reads `stream` from `from` up to (not including) offset `end`, calling `each` with every
/// message; `sized` learns the window's size once its first offset is known (a progress bar's
/// total).
pub async fn read_window<E>(
    conn: &lapin::Connection,
    stream: &str,
    from: SystemTime,
    end: u64,
    mut sized: impl FnMut(u64),
    mut each: impl AsyncFnMut(lapin::message::Delivery) -> Result<(), E>,
) -> Result<(), E>
where
    E: From<StreamReadError>,
{
    let read = |source| StreamReadError {
        stream: stream.to_owned(),
        source,
    };
    let mut reader = StreamReader::open(
        conn,
        stream,
        StreamStart::Timestamp(seconds(from)),
        PREFETCH,
    )
    .await
    .map_err(read)?;
    let mut first = None;
    let result = async {
        // Every message before `end` is in the stream already: a quiet reader means the window
        // holds no more (or nothing at all, when `from` is after its last message).
        while let Ok(Some(next)) = tokio::time::timeout(WINDOW_QUIET, reader.next()).await {
            let m = next.map_err(read)?;
            let Some(offset) = m.offset else { continue };
            if offset >= end {
                break;
            }
            if first.is_none() {
                sized(end - offset);
            }
            first.get_or_insert(offset);
            each(m.delivery).await?;
            if offset + 1 >= end {
                break;
            }
        }
        Ok(())
    }
    .await;
    reader.close().await;
    result
}
