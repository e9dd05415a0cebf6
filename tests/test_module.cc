#include "ref/module.h"
#include <doctest/doctest.h>
