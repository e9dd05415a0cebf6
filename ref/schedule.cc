#include "ref/schedule.h"
