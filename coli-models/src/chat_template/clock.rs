//! `strftime_now(format)`: the local date and time as Python's `datetime.now().strftime`
//! spells it in the C locale (what transformers exposes to templates).

use std::fmt::Write;

/// A local civil date and time (no time zone: Python's `datetime.now()` is naive).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalTime {
    /// The year, e.g. 2025.
    pub year: i32,
    /// 1..=12.
    pub month: u32,
    /// 1..=31.
    pub day: u32,
    /// 0..=23.
    pub hour: u32,
    /// 0..=59.
    pub minute: u32,
    /// 0..=60.
    pub second: u32,
}

const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

fn is_leap(year: i32) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

impl LocalTime {
    /// The machine's local time now (the process's time zone, as Python's `datetime.now()`).
    pub fn now() -> LocalTime {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        // time_t is i64 on every 64-bit target coli builds for; narrower ones saturate.
        #[allow(clippy::useless_conversion)]
        let t: libc::time_t = secs.try_into().unwrap_or_default();
        // SAFETY: `tm` is plain data; `localtime_r` fills it from `t` and touches nothing else.
        let mut tm: libc::tm = unsafe { std::mem::zeroed() };
        // SAFETY: both pointers are valid for the duration of the call.
        let ok = !unsafe { libc::localtime_r(&t, &mut tm) }.is_null();
        if !ok {
            return LocalTime::from_unix_utc(secs);
        }
        LocalTime {
            year: tm.tm_year + 1900,
            month: (tm.tm_mon + 1) as u32,
            day: tm.tm_mday as u32,
            hour: tm.tm_hour as u32,
            minute: tm.tm_min as u32,
            second: tm.tm_sec as u32,
        }
    }

    /// UTC civil time of a Unix timestamp (the fallback when the local zone is unknown).
    pub fn from_unix_utc(secs: i64) -> LocalTime {
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400) as u32;
        // Howard Hinnant's civil_from_days.
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = (yoe + era * 400 + i64::from(month <= 2)) as i32;
        LocalTime {
            year,
            month,
            day,
            hour: rem / 3600,
            minute: rem / 60 % 60,
            second: rem % 60,
        }
    }

    /// Day of the year, 1..=366.
    fn yday(&self) -> u32 {
        const BEFORE: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
        let m = (self.month.clamp(1, 12) - 1) as usize;
        BEFORE[m] + self.day + u32::from(m >= 2 && is_leap(self.year))
    }

    /// 0 = Monday .. 6 = Sunday.
    fn weekday(&self) -> usize {
        // Sakamoto's method gives 0 = Sunday.
        const T: [i32; 12] = [0, 3, 2, 5, 0, 3, 5, 1, 4, 6, 2, 4];
        let m = self.month.clamp(1, 12) as usize;
        let y = if m < 3 { self.year - 1 } else { self.year };
        let sunday0 = (y + y.div_euclid(4) - y.div_euclid(100)
            + y.div_euclid(400)
            + T[m - 1]
            + self.day as i32)
            .rem_euclid(7) as usize;
        (sunday0 + 6) % 7
    }

    /// `strftime(format)` in the C locale. Directives coli does not know are copied as
    /// written, as glibc does.
    pub fn strftime(&self, format: &str) -> String {
        let mut out = String::new();
        let mut chars = format.chars();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            let Some(d) = chars.next() else {
                out.push('%');
                break;
            };
            let month = MONTHS[(self.month.clamp(1, 12) - 1) as usize];
            let day = DAYS[self.weekday()];
            let hour12 = match self.hour % 12 {
                0 => 12,
                h => h,
            };
            let _ = match d {
                'Y' => write!(out, "{}", self.year),
                'y' => write!(out, "{:02}", self.year.rem_euclid(100)),
                'm' => write!(out, "{:02}", self.month),
                'd' => write!(out, "{:02}", self.day),
                'e' => write!(out, "{:2}", self.day),
                'H' => write!(out, "{:02}", self.hour),
                'I' => write!(out, "{hour12:02}"),
                'M' => write!(out, "{:02}", self.minute),
                'S' => write!(out, "{:02}", self.second),
                'p' => write!(out, "{}", if self.hour < 12 { "AM" } else { "PM" }),
                'j' => write!(out, "{:03}", self.yday()),
                'b' | 'h' => write!(out, "{}", &month[..3]),
                'B' => write!(out, "{month}"),
                'a' => write!(out, "{}", &day[..3]),
                'A' => write!(out, "{day}"),
                'u' => write!(out, "{}", self.weekday() + 1),
                'w' => write!(out, "{}", (self.weekday() + 1) % 7),
                'F' => write!(out, "{}-{:02}-{:02}", self.year, self.month, self.day),
                'T' | 'X' => write!(
                    out,
                    "{:02}:{:02}:{:02}",
                    self.hour, self.minute, self.second
                ),
                'D' | 'x' => write!(
                    out,
                    "{:02}/{:02}/{:02}",
                    self.month,
                    self.day,
                    self.year.rem_euclid(100)
                ),
                'c' => write!(
                    out,
                    "{} {} {:2} {:02}:{:02}:{:02} {}",
                    &day[..3],
                    &month[..3],
                    self.day,
                    self.hour,
                    self.minute,
                    self.second,
                    self.year
                ),
                // A naive datetime has no zone: Python prints nothing.
                'z' | 'Z' => Ok(()),
                '%' => write!(out, "%"),
                other => write!(out, "%{other}"),
            };
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_matches_python_for_a_fixed_date() {
        let t = LocalTime {
            year: 2025,
            month: 3,
            day: 14,
            hour: 9,
            minute: 26,
            second: 53,
        };
        assert_eq!(t.strftime("%d %b %Y"), "14 Mar 2025");
        assert_eq!(t.strftime("%Y-%m-%d"), "2025-03-14");
        assert_eq!(t.strftime("%A %B %j %I%p %%"), "Friday March 073 09AM %");
        assert_eq!(t.strftime("%c"), "Fri Mar 14 09:26:53 2025");
    }

    #[test]
    fn unix_time_to_civil_date() {
        assert_eq!(
            LocalTime::from_unix_utc(1_741_944_413),
            LocalTime {
                year: 2025,
                month: 3,
                day: 14,
                hour: 9,
                minute: 26,
                second: 53
            }
        );
        assert_eq!(LocalTime::from_unix_utc(951_782_400).day, 29); // 2000-02-29
    }
}
