//! What a broker refusal means. The broker turns a request down by closing the channel with a
//! reply code (an AMQP soft error); lapin hands that code over typed, so hookrelay classifies
//! refusals by code, never by the wording of the reply text.

use lapin::protocol::{AMQPErrorKind, AMQPSoftError};

/// A request the broker understood and refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// 406 PRECONDITION_FAILED: the object exists with other arguments (or another
    /// precondition of the request does not hold).
    PreconditionFailed,
    /// 404 NOT_FOUND: the queue or exchange does not exist.
    NotFound,
    /// 403 ACCESS_REFUSED: the user may not do this to this object (or the name is reserved).
    AccessRefused,
    /// 405 RESOURCE_LOCKED: another connection holds the queue exclusively.
    ResourceLocked,
}

/// The refusal behind `error`, or `None` for anything else (the connection dropped, a
/// connection-level error, a soft error hookrelay has no use for).
pub fn refused(error: &lapin::Error) -> Option<Refusal> {
    let lapin::ErrorKind::ProtocolError(e) = error.kind() else {
        return None;
    };
    match e.kind() {
        AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED) => Some(Refusal::PreconditionFailed),
        AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND) => Some(Refusal::NotFound),
        AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED) => Some(Refusal::AccessRefused),
        AMQPErrorKind::Soft(AMQPSoftError::RESOURCELOCKED) => Some(Refusal::ResourceLocked),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use lapin::protocol::{AMQPError, AMQPHardError};

    use super::*;

    fn closed_with(kind: AMQPErrorKind, text: &str) -> lapin::Error {
        lapin::ErrorKind::ProtocolError(AMQPError::new(kind, text.into())).into()
    }

    #[test]
    fn refusals_are_told_apart_by_reply_code() {
        for (code, refusal) in [
            (
                AMQPSoftError::PRECONDITIONFAILED,
                Refusal::PreconditionFailed,
            ),
            (AMQPSoftError::NOTFOUND, Refusal::NotFound),
            (AMQPSoftError::ACCESSREFUSED, Refusal::AccessRefused),
            (AMQPSoftError::RESOURCELOCKED, Refusal::ResourceLocked),
        ] {
            // The text says nothing: only the code counts.
            let error = closed_with(code.clone().into(), "no words");
            assert_eq!(refused(&error), Some(refusal), "{code:?}");
        }
    }

    #[test]
    fn other_errors_are_not_refusals() {
        let wording = closed_with(
            AMQPSoftError::NOROUTE.into(),
            "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl'",
        );
        let hard = closed_with(AMQPHardError::CONNECTIONFORCED.into(), "NOT_FOUND");
        let io = lapin::Error::from(std::io::Error::other("NOT_FOUND"));
        for error in [wording, hard, io] {
            assert_eq!(refused(&error), None, "{error}");
        }
    }
}
