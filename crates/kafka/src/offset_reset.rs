//! A consumer that could not read where it was: librdkafka moved it to `auto.offset.reset` (the earliest record)
//! because the broker no longer had the offset it asked for, usually because retention removed records before the
//! group read them. librdkafka reports this only as a warning line (facility `OFFSET`), and the application's own
//! view (the next record's offset) cannot tell it apart from a fresh start when it happens at an assignment, where
//! the offset asked for is the group's committed one. So the line is read here.
//!
//! The line has kept this shape since librdkafka 2.1 (`rd_kafka_offset_reset` in `rdkafka_offset.c`):
//! `[thrd:main]: <topic> [<partition>]: offset reset (at offset <n> (leader epoch <e>), broker <id>) to <where>: <reason>:
//! <error>`.
//! It is logged at warning level only when an error caused the reset; a group's first read with no committed
//! offset is a debug line and is not a reset here.

/// One reset: the consumer wanted `from` on `topic`/`partition` and reads from the reset position instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetReset {
    pub topic: String,
    pub partition: i32,
    /// The offset the broker did not have. Records from here up to the first one read after the reset were never
    /// read, if that one is further on.
    pub from: i64,
    /// How many rebalance events the consumer's context had reported when the reset happened: an owner that forgets
    /// its per-partition state at each rebalance applies a reset only while it has seen exactly that many.
    pub after_rebalances: u64,
}

/// Reads an error reset out of a librdkafka log line of facility `OFFSET`; `None` for anything else.
pub fn parse(facility: &str, line: &str) -> Option<(String, i32, i64)> {
    if facility != "OFFSET" {
        return None;
    }
    let (head, rest) = line.split_once("]: offset reset (at offset ")?;
    let (topic, partition) = head.rsplit_once(" [")?;
    // A topic name has no spaces; librdkafka may put its thread's name before it (`[thrd:main]: `).
    let topic = topic.rsplit_once(' ').map_or(topic, |(_, t)| t);
    let from = rest.split(|c: char| !c.is_ascii_digit()).next().filter(|n| !n.is_empty())?;
    if topic.is_empty() {
        return None;
    }
    Some((topic.to_owned(), partition.parse().ok()?, from.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_out_of_range_reset_names_the_topic_partition_and_the_offset_that_was_gone() {
        let queried = "hookline.attempts [3]: offset reset (at offset 1 (leader epoch -1), broker 1) to offset BEGINNING \
                       (leader epoch -1): fetch failed due to requested offset not available on the broker: Broker: Offset out of range";
        assert_eq!(parse("OFFSET", queried), Some(("hookline.attempts".into(), 3, 1)));
        let cached = "[thrd:main]: t.deliveries [12]: offset reset (at offset 4096 (leader epoch 7), broker 2) to cached BEGINNING offset \
                      offset 9000 (leader epoch -1): fetch failed due to requested offset not available on the broker: Broker: Offset out of range";
        assert_eq!(parse("OFFSET", cached), Some(("t.deliveries".into(), 12, 4096)));
    }

    #[test]
    fn other_lines_are_not_resets() {
        let line = "hookline.attempts [3]: offset reset (at offset 1 (leader epoch -1), broker 1) to offset BEGINNING (leader epoch -1): x";
        assert_eq!(parse("FETCH", line), None, "another facility");
        assert_eq!(
            parse("OFFSET", "hookline.attempts [3]: offset reset (at offset INVALID (leader epoch -1), broker -1) to offset BEGINNING"),
            None
        );
        assert_eq!(parse("OFFSET", "hookline.attempts [x]: offset reset (at offset 5 (leader epoch -1), broker 1) to END"), None);
        assert_eq!(parse("OFFSET", " [1]: offset reset (at offset 5 (leader epoch -1), broker 1) to END"), None, "no topic");
        assert_eq!(parse("OFFSET", "[thrd:main]:  [1]: offset reset (at offset 5 (leader epoch -1), broker 1) to END"), None, "no topic");
        assert_eq!(parse("OFFSET", "Topic t [0]: stored offset 5 (leader epoch -1), committed offset 4"), None);
        assert_eq!(
            parse("OFFSET", "t [0]: offset reset (at offset 99999999999999999999 (leader epoch -1), broker 1) to END"),
            None,
            "no overflow"
        );
        assert_eq!(parse("OFFSET", ""), None);
    }
}
