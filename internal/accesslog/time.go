package accesslog

import "time"

// parseTime reads an RFC 3339 time as slog's JSON handler writes it
// (time.RFC3339Nano) and returns it in µs since the Unix epoch (t.UnixMicro()).
// The common shape, 2026-11-24T14:38:22.123456789Z or with a ±hh:mm
// offset, is read here; anything else goes to time.Parse, whose verdict
// this always matches.
func parseTime(b []byte) (int64, bool) {
	if us, ok := fastTime(b); ok {
		return us, true
	}
	t, err := time.Parse(time.RFC3339Nano, string(b))
	if err != nil {
		return 0, false
	}
	return t.UnixMicro(), true
}

// fastTime reads YYYY-MM-DDTHH:MM:SS[.F{1,9}](Z|±hh:mm); ok is false for
// anything else, valid or not.
func fastTime(b []byte) (us int64, ok bool) {
	if len(b) < len("2006-01-02T15:04:05Z") || b[4] != '-' || b[7] != '-' || b[10] != 'T' || b[13] != ':' || b[16] != ':' {
		return 0, false
	}
	num := func(s []byte) int {
		n := 0
		for _, c := range s {
			if c < '0' || c > '9' {
				return -1
			}
			n = n*10 + int(c-'0')
		}
		return n
	}
	year, month, day := num(b[0:4]), num(b[5:7]), num(b[8:10])
	hour, minute, sec := num(b[11:13]), num(b[14:16]), num(b[17:19])
	if year < 0 || month < 1 || month > 12 || day < 1 || day > daysIn(month, year) ||
		hour < 0 || hour > 23 || minute < 0 || minute > 59 || sec < 0 || sec > 59 {
		return 0, false
	}
	rest := b[19:]
	var nsec int64
	if rest[0] == '.' {
		n := 1
		for n < len(rest) && '0' <= rest[n] && rest[n] <= '9' {
			n++
		}
		if n == 1 || n > 10 {
			return 0, false
		}
		for i := 1; i < 10; i++ {
			nsec *= 10
			if i < n {
				nsec += int64(rest[i] - '0')
			}
		}
		rest = rest[n:]
	}
	var offset int64
	switch {
	case len(rest) == 1 && rest[0] == 'Z':
	case len(rest) == 6 && (rest[0] == '+' || rest[0] == '-') && rest[3] == ':':
		hh, mm := num(rest[1:3]), num(rest[4:6])
		if hh < 0 || hh > 23 || mm < 0 || mm > 59 {
			return 0, false
		}
		offset = int64(hh*60+mm) * 60
		if rest[0] == '-' {
			offset = -offset
		}
	default:
		return 0, false
	}
	secs := daysSinceEpoch(year, month, day)*86400 + int64(hour*3600+minute*60+sec) - offset
	return secs*1_000_000 + nsec/1000, true
}

func isLeap(y int) bool { return y%4 == 0 && (y%100 != 0 || y%400 == 0) }

func daysIn(month, year int) int {
	switch month {
	case 2:
		if isLeap(year) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}

// daysSinceEpoch returns the days from 1970-01-01 to the given date of the
// proleptic Gregorian calendar (Howard Hinnant's days_from_civil).
func daysSinceEpoch(y, m, d int) int64 {
	if m <= 2 {
		y--
	}
	era := y / 400
	if y < 0 {
		era = (y - 399) / 400
	}
	yoe := y - era*400
	mp := (m + 9) % 12
	doy := (153*mp+2)/5 + d - 1
	doe := yoe*365 + yoe/4 - yoe/100 + doy
	return int64(era)*146097 + int64(doe) - 719468
}
