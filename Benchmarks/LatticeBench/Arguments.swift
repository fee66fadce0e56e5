// Command-line parsing for `lattice-bench merge` (option names and defaults as in the reference
// peer_merge_bench.py). Errors are `UsageError`s: printed on stderr, exit status 2.

/// A bad command line.
struct UsageError: Error, CustomStringConvertible {
    let message: String
    var description: String { message }
}

/// Walks a command line one option at a time: `--name value`, `--name=value` and flags.
struct OptionScanner {
    private let arguments: [String]
    private var index = 0
    /// The current argument as written, and its option name (without an inline `=value`).
    private(set) var argument = ""
    private(set) var name = ""
    private var inlineValue: String?

    init(_ arguments: [String]) { self.arguments = arguments }

    /// Moves to the next argument; false at the end.
    mutating func next() -> Bool {
        guard index < arguments.count else { return false }
        argument = arguments[index]
        index += 1
        name = argument
        inlineValue = nil
        if argument.hasPrefix("--"), let equals = argument.firstIndex(of: "=") {
            name = String(argument[..<equals])
            inlineValue = String(argument[argument.index(after: equals)...])
        }
        return true
    }

    /// The current option's value: inline, or the next argument.
    mutating func value() throws(UsageError) -> String {
        if let inlineValue { return inlineValue }
        guard index < arguments.count else { throw UsageError(message: "\(name) expects a value") }
        index += 1
        return arguments[index - 1]
    }

    /// Checks that the current option, a flag, was given no value.
    func flag() throws(UsageError) {
        if inlineValue != nil { throw UsageError(message: "\(name) takes no value") }
    }

    /// The current option's value as an integer in `range`.
    mutating func integer(in range: ClosedRange<Int>) throws(UsageError) -> Int {
        let text = try value()
        guard let number = Int(text.filter { $0 != "_" }), range.contains(number) else {
            throw UsageError(message: "\(name) takes an integer from \(range.lowerBound) to \(range.upperBound), not \(text)")
        }
        return number
    }

    /// The current option's value as a positive number of seconds.
    mutating func seconds() throws(UsageError) -> Double {
        let text = try value()
        guard let seconds = Double(text), seconds > 0, seconds.isFinite else {
            throw UsageError(message: "\(name) takes a positive number of seconds, not \(text)")
        }
        return seconds
    }

    /// An option no command knows, or an argument none takes.
    func unknown() -> UsageError {
        UsageError(message: argument.hasPrefix("-") ? "unrecognized option \(argument)" : "unexpected argument \(argument)")
    }
}

/// The options of `lattice-bench merge`.
struct MergeOptions: Sendable {
    /// The workload (validated by `parse`).
    var parameters = WorkloadParameters()
    /// Repetitions per scenario, each in a fresh process.
    var reps = 5
    /// Scenarios in run order.
    var scenarios: [Scenario] = [.delta, .full]
    /// Run the post-merge correctness and convergence check.
    var verify = true
    /// Also write every JSON line to this file.
    var jsonlPath: String?
    /// Write the workload's digest lines here, print the digest line, and exit.
    var dumpWorkloadPath: String?
    /// Seconds a worker may run before it is killed.
    var workerTimeoutSeconds = 1800.0
    /// `--help` was given.
    var help = false

    // Hidden: set in the per-repetition worker process.
    var worker = false
    var workerScenario: Scenario = .delta
    var workerRep = 0

    static let usage = """
        usage: lattice-bench merge [--records N] [--fields F] [--tags T] [--tag-vocab V]
                                   [--edit-frac E] [--fields-per-edit K] [--seed S]
                                   [--reps R] [--scenarios delta,full] [--no-verify]
                                   [--jsonl FILE] [--worker-timeout SECONDS]
                                   [--dump-workload FILE]

        Merge-throughput benchmark on workload lww-orset-v1 (see /work/shared/bench/README.md):
        replicas A and B share N base records, each edits a fraction of them, then B's changes
        are merged into A (scenario delta: B's changes since the base; full: B's whole state).
        Prints JSON lines on stdout: one header, one run line per repetition and scenario (each
        repetition runs in a fresh process), one summary line per scenario.

        options:
          -n, --records N         number of records N (default 10000)
          -f, --fields F          scalar fields per record F (default 8)
          --tags T                tags per record in the base state (default 4; must be < V)
          --tag-vocab V           size of the tag vocabulary (default 64)
          --edit-frac E           probability that a replica edits a given record, in [0, 1]
                                  (default 0.5)
          --fields-per-edit K     scalar fields updated per edited record (default 2; at
                                  most F)
          --seed S                RNG seed (default 42; a negative seed is taken mod 2^64)
          --reps R                repetitions per scenario (default 5)
          --scenarios LIST        comma list from delta,full (default delta,full)
          --no-verify             skip the post-merge correctness and convergence check
          --jsonl FILE            also write all JSON lines to FILE
          --worker-timeout SECS   seconds per worker process (default 1800)
          --dump-workload FILE    write the workload's digest lines to FILE, print the digest,
                                  and exit
          -h, --help              show this help and exit

        exit status: 0 when every run is ok, 1 when a run failed, 2 for a bad command line.
        """

    /// Parses the arguments after `merge`; validates the workload parameters too.
    static func parse(_ arguments: [String]) throws(UsageError) -> MergeOptions {
        var options = MergeOptions()
        var scanner = OptionScanner(arguments)
        while scanner.next() {
            let name = scanner.name, argument = scanner.argument
            func value() throws(UsageError) -> String { try scanner.value() }
            func flag() throws(UsageError) { try scanner.flag() }
            switch name {
            case "-h", "--help": try flag(); options.help = true
            case "-n", "--records": options.parameters.records = try integer(name, try value())
            case "-f", "--fields": options.parameters.fields = try integer(name, try value())
            case "--tags": options.parameters.tags = try integer(name, try value())
            case "--tag-vocab": options.parameters.tagVocab = try integer(name, try value())
            case "--edit-frac": options.parameters.editFraction = try number(name, try value())
            case "--fields-per-edit": options.parameters.fieldsPerEdit = try integer(name, try value())
            case "--seed": options.parameters.seed = try seed(try value())
            case "--reps": options.reps = try integer(name, try value())
            case "--scenarios": options.scenarios = try scenarioList(try value())
            case "--no-verify": try flag(); options.verify = false
            case "--jsonl": options.jsonlPath = try path(name, try value())
            case "--dump-workload": options.dumpWorkloadPath = try path(name, try value())
            case "--worker-timeout": options.workerTimeoutSeconds = try number(name, try value())
            // Hidden options of the worker process.
            case "--worker": try flag(); options.worker = true
            case "--verify": try flag(); options.verify = true
            case "--scenario": options.workerScenario = try scenarioList(try value(), single: true)[0]
            case "--rep": options.workerRep = try integer(name, try value())
            default:
                if argument.hasPrefix("-") && argument.count > 1 {
                    throw UsageError(message: "unrecognized option \(argument)")
                }
                throw UsageError(message: "unexpected argument \(argument)")
            }
        }
        if options.help { return options }
        do {
            try options.parameters.validate()
        } catch {
            throw UsageError(message: error.message)
        }
        if options.reps < 1 { throw UsageError(message: "--reps must be at least 1 (got \(options.reps))") }
        if options.reps > 10_000 { throw UsageError(message: "--reps must be at most 10000 (got \(options.reps))") }
        if options.workerRep < 0 { throw UsageError(message: "--rep must not be negative") }
        if !options.workerTimeoutSeconds.isFinite || options.workerTimeoutSeconds <= 0 {
            throw UsageError(message: "--worker-timeout must be a positive number of seconds")
        }
        return options
    }

    /// The command line of the worker process for one repetition of one scenario.
    func workerArguments(scenario: Scenario, rep: Int) -> [String] {
        let p = parameters
        var arguments = ["merge", "--worker", "--scenario", scenario.rawValue, "--rep", String(rep),
                         "--records", String(p.records), "--fields", String(p.fields),
                         "--tags", String(p.tags), "--tag-vocab", String(p.tagVocab),
                         "--edit-frac", JSONValue.pythonRepr(p.editFraction),
                         "--fields-per-edit", String(p.fieldsPerEdit), "--seed", String(p.seed)]
        if !verify { arguments.append("--no-verify") }
        return arguments
    }

    // MARK: Value parsers

    private static func integer(_ name: String, _ text: String) throws(UsageError) -> Int {
        guard let value = Int(withoutDigitSeparators(text)) else {
            throw UsageError(message: "\(name) expects an integer, got '\(text)'")
        }
        return value
    }

    private static func number(_ name: String, _ text: String) throws(UsageError) -> Double {
        guard let value = Double(withoutDigitSeparators(text)), value.isFinite else {
            throw UsageError(message: "\(name) expects a finite number, got '\(text)'")
        }
        return value
    }

    /// A seed in -2^63 ..< 2^64; negative seeds become their value mod 2^64 like the reference.
    private static func seed(_ text: String) throws(UsageError) -> UInt64 {
        let digits = withoutDigitSeparators(text)
        if let value = UInt64(digits) { return value }
        if let value = Int64(digits) { return UInt64(bitPattern: value) }
        throw UsageError(message: "--seed expects an integer in -2^63 ..< 2^64, got '\(text)'")
    }

    private static func path(_ name: String, _ text: String) throws(UsageError) -> String {
        guard !text.isEmpty else { throw UsageError(message: "\(name) expects a file name") }
        return text
    }

    private static func scenarioList(_ text: String, single: Bool = false) throws(UsageError) -> [Scenario] {
        var scenarios: [Scenario] = []
        for part in text.split(separator: ",", omittingEmptySubsequences: true) {
            let name = part.filter { $0 != " " }
            guard let scenario = Scenario(rawValue: name) else {
                throw UsageError(message: "unknown scenario '\(name)'; choose from delta, full")
            }
            if !scenarios.contains(scenario) { scenarios.append(scenario) }
        }
        if scenarios.isEmpty { throw UsageError(message: "--scenarios needs at least one of delta, full") }
        if single && scenarios.count != 1 { throw UsageError(message: "--scenario takes exactly one scenario") }
        return scenarios
    }

    /// `10_000` -> `10000` (Python's int() accepts underscores between digits).
    private static func withoutDigitSeparators(_ text: String) -> String {
        guard text.contains("_") else { return text }
        let characters = Array(text)
        for (position, character) in characters.enumerated() where character == "_" {
            let before = position > 0 ? characters[position - 1] : " "
            let after = position + 1 < characters.count ? characters[position + 1] : " "
            if !(before.isASCII && before.isNumber && after.isASCII && after.isNumber) { return text }
        }
        return text.filter { $0 != "_" }
    }
}
