// The progress reporter: its line formats, plain periodic lines vs a live \r line, silence for
// short work and on ranks that do not log, and reports from many threads at once.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "meshtrain/core/progress.h"
#include "test_support.h"

namespace meshtrain {
namespace {

std::string read_all(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) s.append(buf, n);
  return s;
}

TEST(Progress, LineFormats) {
  EXPECT_EQ(Progress::format_report("tokenizing", 1'230'000, 4'560'000, 2.0, ProgressUnit::kBytes),
            "tokenizing: 1.23 MB / 4.56 MB (27%), 615.00 kB/s, 5s left");
  EXPECT_EQ(Progress::format_report("init", 2'000'000, 8'000'000'000, 1.0, ProgressUnit::kCount),
            "init: 2.00M / 8.00G (0%), 2.00M/s, 1h06m left");
  EXPECT_EQ(Progress::format_report("loading", 512, 0, 1.0, ProgressUnit::kBytes),
            "loading: 512 B, 512 B/s");
  EXPECT_EQ(Progress::format_summary("tokenizing", 4'560'000, 1.3, ProgressUnit::kBytes),
            "tokenizing: 4.56 MB in 1s, 3.51 MB/s");
  EXPECT_EQ(Progress::format_duration(0.4), "<1s");
  EXPECT_EQ(Progress::format_duration(185), "3m05s");
  EXPECT_EQ(Progress::format_duration(7620), "2h07m");
}

TEST(Progress, PlainLinesLiveLineAndSilence) {
  std::FILE* plain = std::tmpfile();
  {
    Progress p(
        "work", 10,
        {.interval_seconds = 1e-9, .quiet_seconds = 0, .enabled = 1, .live = 0, .stream = plain});
    for (int i = 0; i < 10; ++i) p.add(1);
    EXPECT_TRUE(p.shown());
  }  // the destructor prints the summary
  const std::string out = read_all(plain);
  EXPECT_CONTAINS(out, "work: 1 / 10 (10%)");
  EXPECT_CONTAINS(out, "work: 10 / 10 (100%)");
  EXPECT_CONTAINS(out, "work: 10 in ");
  EXPECT_EQ(out.find('\r'), std::string::npos);
  EXPECT_EQ(out.back(), '\n');
  std::fclose(plain);

  std::FILE* live = std::tmpfile();
  {
    Progress p(
        "work", 4,
        {.interval_seconds = 1e-9, .quiet_seconds = 0, .enabled = 1, .live = 1, .stream = live});
    p.add(2);
    p.add(2);
    p.finish();
  }
  const std::string l = read_all(live);
  EXPECT_EQ(l.rfind("\rwork: 2 / 4 (50%)", 0), 0u) << l;
  EXPECT_EQ(std::count(l.begin(), l.end(), '\n'), 1) << "one line, rewritten in place";
  std::fclose(live);

  std::FILE* quiet = std::tmpfile();
  {
    Progress shortwork("short", 4, {.quiet_seconds = 60, .enabled = 1, .stream = quiet});
    shortwork.add(4);
    Progress other_rank("off", 4, {.quiet_seconds = 0, .enabled = 0, .stream = quiet});
    other_rank.add(4);
  }
  EXPECT_EQ(read_all(quiet), "");
  std::fclose(quiet);
}

TEST(Progress, ManyThreadsCountEverything) {
  std::FILE* f = std::tmpfile();
  Progress p("threads", 0,
             {.interval_seconds = 1e-6, .quiet_seconds = 0, .enabled = 1, .live = 0, .stream = f});
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) p.add(1);
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(p.done(), 40000);
  p.finish();
  EXPECT_CONTAINS(read_all(f), "threads: 40.00k in ");
  std::fclose(f);
}

}  // namespace
}  // namespace meshtrain
