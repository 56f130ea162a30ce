//! Reading the ladder's streams (the archive, the attempt log) from an offset: what replay,
//! trace and history build on. A stream keeps what it holds whoever reads it; a reader names
//! where to start and acknowledges what it read (the broker's credit for the next ones).

use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::{AMQPValue, FieldTable};

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
    pub async fn next(&mut self) -> Option<Result<StreamMessage, lapin::Error>> {
        let delivery = match self.consumer.next().await? {
            Ok(d) => d,
            Err(e) => return Some(Err(e)),
        };
        let offset = offset_of(&delivery);
        if let Err(e) = delivery.acker.ack(BasicAckOptions::default()).await {
            return Some(Err(e));
        }
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
