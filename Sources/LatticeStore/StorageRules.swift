/// The decisions about records, shares and purging that every storage backend must make the same way.
///
/// A backend stores and finds rows; when a write needs a decision (what a change tag looks like, who
/// created a record, where a share's link epochs start, which deleted zones may be forgotten), it asks
/// here instead of writing its own copy. `StorageContractTests` holds each backend to these answers.
public enum StorageRules {
    // MARK: User names

    /// The replacements that make a user name's key, in order: names whose keys are equal cannot both be
    /// taken ("Mom" and "mom", "bil1" and "bill", "rnary" and "mary"). User names are ASCII letters, digits
    /// and `.`, `_`, `-`; these are the look-alikes among them (Unicode's confusables for that set) and
    /// case. The same chain runs in SQL (`userNameKeySQL`), so a database can key the names it already holds.
    static let userNameFolds: [(from: String, to: String, beforeLowercasing: Bool)] = [
        ("I", "l", true), ("1", "l", false), ("0", "o", false), ("rn", "m", false), ("vv", "w", false), ("cl", "d", false),
    ]

    /// A user name's key: case- and look-alike-insensitive (`userNameFolds`).
    public static func userNameKey(_ name: String) -> String {
        var key = name
        for fold in userNameFolds where fold.beforeLowercasing { key = key.replacingOccurrences(of: fold.from, with: fold.to) }
        key = String(key.lowercased())
        for fold in userNameFolds where !fold.beforeLowercasing {
            key = key.replacingOccurrences(of: fold.from, with: fold.to)
        }
        return key
    }

    /// `userNameKey` of the SQL expression `column`, in SQL both backends run (`replace`, `lower`).
    static func userNameKeySQL(_ column: String) -> String {
        var expression = column
        for fold in userNameFolds where fold.beforeLowercasing { expression = "replace(\(expression), '\(fold.from)', '\(fold.to)')" }
        expression = "lower(\(expression))"
        for fold in userNameFolds where !fold.beforeLowercasing {
            expression = "replace(\(expression), '\(fold.from)', '\(fold.to)')"
        }
        return expression
    }

    /// The migration that keys the names a database holds. Names taken before keys existed that share a key
    /// keep their accounts: every one after the first gets its key suffixed with `#` and its id, so the
    /// index stays unique and no new name can take any of those keys.
    static var userNameKeyMigration: String {
        """
        ALTER TABLE users ADD COLUMN name_key TEXT;
        UPDATE users SET name_key = \(userNameKeySQL("name")) || CASE WHEN EXISTS (SELECT 1 FROM users AS earlier
            WHERE \(userNameKeySQL("earlier.name")) = \(userNameKeySQL("users.name")) AND earlier.id < users.id)
            THEN '#' || CAST(id AS TEXT) ELSE '' END;
        CREATE UNIQUE INDEX users_by_name_key ON users(name_key);
        """
    }

    // MARK: Records

    /// CloudKit's `recordChangeTag` for the record at log position `seq` of zone row `zoneRowID`.
    ///
    /// It names the zone incarnation and the log position, so every save gets a new tag, and a tag from
    /// a deleted and recreated zone of the same name never matches. For example zone 7, position 40 is
    /// `"7-14"` (both in base 36).
    public static func changeTag(zoneRowID: Int64, seq: Int64) -> String {
        // Row ids and positions are never negative; a negative one is spelled as `String(_:radix:)` does.
        guard zoneRowID >= 0, seq >= 0 else { return String(zoneRowID, radix: 36) + "-" + String(seq, radix: 36) }
        // Written digit by digit into the string's own storage: this runs once per record read or saved,
        // and the generic `String(_:radix:)` cost a third of the time of binding a record's row.
        func width(_ value: Int64) -> Int {
            var count = 1, rest = value / 36
            while rest > 0 { count += 1; rest /= 36 }
            return count
        }
        let zoneWidth = width(zoneRowID), seqWidth = width(seq)
        return String(unsafeUninitializedCapacity: zoneWidth + 1 + seqWidth) { buffer in
            func write(_ value: Int64, endingAt end: Int) {
                var rest = value, index = end
                repeat {
                    index -= 1
                    let digit = UInt8(rest % 36)
                    buffer[index] = digit < 10 ? UInt8(ascii: "0") + digit : UInt8(ascii: "a") + digit - 10
                    rest /= 36
                } while rest > 0
            }
            write(zoneRowID, endingAt: zoneWidth)
            buffer[zoneWidth] = UInt8(ascii: "-")
            write(seq, endingAt: zoneWidth + 1 + seqWidth)
            return zoneWidth + 1 + seqWidth
        }
    }

    /// When and by whom the record that `write` saves was created, given the row it replaces.
    ///
    /// A save over a live record, and a deletion over a tombstone, continue that record: its creation
    /// stays. A record written over its tombstone (or with no row before it) is a new record: it is
    /// created now, by the writer.
    public static func creation(of write: RecordWrite, replacing previous: StoredRecord?)
        -> (createdMs: Int64, createdBy: String) {
        if let previous, !previous.deleted || write.deleted {
            return (previous.createdMs, previous.createdBy)
        }
        return (write.nowMs, write.userRecordName)
    }

    // MARK: Shares

    /// The URL epoch of a new share. Share links carry the epoch they were signed for; resetting the link
    /// raises the share's epoch, which voids every older link.
    public static let firstURLEpoch: Int64 = 1

    // MARK: Purging

    /// Whether `purge` forgets a deleted zone that is past the horizon.
    ///
    /// A zone that a share was ever made in (live or deleted) stays: the share row, the share's own log
    /// and every participant's shared-database log refer to it, and a participant must still be able to
    /// learn that the zone went away.
    public static func purgesDeletedZone(_ candidate: DeletedZone) -> Bool {
        !candidate.hasShares
    }
}

/// A deleted zone past the purge horizon, with the facts `StorageRules.purgesDeletedZone` decides on.
public struct DeletedZone: Sendable, Hashable {
    public let zone: StoredZone
    /// Whether any share, live or deleted, was made in the zone.
    public let hasShares: Bool

    public init(zone: StoredZone, hasShares: Bool) {
        self.zone = zone
        self.hasShares = hasShares
    }
}
