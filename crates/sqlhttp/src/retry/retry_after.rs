//! Parsing the `Retry-After` header: a non-negative whole number of seconds or an HTTP-date.
//!
//! Anything else (fractions, signs, junk, values beyond [`MAX_RETRY_AFTER`]) is ignored, so a mistaken
//! or hostile server cannot park a caller; the loop then uses its computed backoff. Capping a valid
//! value by `max_backoff` is the loop's business, not this module's.

use std::time::{Duration, SystemTime};

/// The longest wait accepted from a server; larger values are treated as nonsense and ignored.
pub(crate) const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 60 * 60);

/// Parses a `Retry-After` value as seen at `now`. A date in the past means no wait.
pub(crate) fn parse(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if value.is_empty() {
        return None;
    }
    let wait = if value.bytes().all(|b| b.is_ascii_digit()) {
        Duration::from_secs(value.parse::<u64>().ok()?)
    } else {
        let at = httpdate::parse_http_date(value).ok()?;
        at.duration_since(now).unwrap_or(Duration::ZERO)
    };
    (wait <= MAX_RETRY_AFTER).then_some(wait)
}

/// Reads `Retry-After` from response headers (the first value, if it is valid text).
pub(crate) fn from_headers(headers: &http::HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers.get(http::header::RETRY_AFTER)?.to_str().ok()?;
    parse(value, now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn now() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)
    }

    #[test]
    fn whole_seconds() {
        assert_eq!(parse("2", now()), Some(Duration::from_secs(2)));
        assert_eq!(parse("0", now()), Some(Duration::ZERO));
        assert_eq!(parse(" 120 ", now()), Some(Duration::from_secs(120)));
    }

    #[test]
    fn http_date_in_the_future() {
        let at = now() + Duration::from_secs(30);
        assert_eq!(
            parse(&httpdate::fmt_http_date(at), now()),
            Some(Duration::from_secs(30))
        );
    }

    #[test]
    fn http_date_in_the_past_means_no_wait() {
        let at = now() - Duration::from_secs(3600);
        assert_eq!(
            parse(&httpdate::fmt_http_date(at), now()),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn nonsense_is_ignored() {
        for junk in [
            "",
            "  ",
            "-1",
            "+3",
            "1.5",
            "0.5",
            "soon",
            "2s",
            "1e3",
            "0x10",
            "Wed, 99 Foo 2024",
            "18446744073709551616",
            "99999999999999999999999",
        ] {
            assert_eq!(parse(junk, now()), None, "{junk:?}");
        }
    }

    #[test]
    fn absurdly_large_is_ignored() {
        assert_eq!(parse("86401", now()), None);
        assert_eq!(parse("86400", now()), Some(MAX_RETRY_AFTER));
        let far = now() + Duration::from_secs(10 * 24 * 3600);
        assert_eq!(parse(&httpdate::fmt_http_date(far), now()), None);
    }

    #[test]
    fn reads_the_header() {
        let mut headers = http::HeaderMap::new();
        assert_eq!(from_headers(&headers, now()), None);
        headers.insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from_static("7"),
        );
        assert_eq!(from_headers(&headers, now()), Some(Duration::from_secs(7)));
    }

    proptest! {
        #[test]
        fn never_panics(s in any::<String>()) {
            let _ = parse(&s, now());
        }

        #[test]
        fn accepts_every_whole_second_up_to_the_limit(secs in 0u64..=86_400) {
            prop_assert_eq!(parse(&secs.to_string(), now()), Some(Duration::from_secs(secs)));
        }
    }
}
